"""The HTTP surface of the arbiter process: the Falcon app, its resources (worker API, operator API,
status page), authentication and the OpenAPI description."""
