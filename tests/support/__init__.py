"""Helpers the tests share: processes, fixtures, programs, fault tools. Test-only code lives here,
never in arbiter/ or worker/."""
