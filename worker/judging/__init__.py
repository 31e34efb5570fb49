"""The worker process: judging one assignment (compile, run each test in the sandbox, compare or run
a checker), the test-data cache and the budget of a result's detail."""
