"""The worker process's sandbox: bwrap + the launcher (launcher.c, PID 1 of a run), boxes that stay
up for a submission, cgroups. A verdict is the program's own doing, never the machine's."""
