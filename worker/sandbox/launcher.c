/* Both ends of the sandbox's launch chain, one static binary:
 *
 *   judge-launcher --enter [OPTION...] -- BWRAP [ARG...]     (as root, outside: the first step)
 *   judge-launcher -- PROGRAM [ARG...]                      (inside: PID 1, fd 9 the report pipe)
 *   judge-launcher --box                                    (inside: PID 1 of a submission's box,
 *                                                            fd 9 a SOCK_SEQPACKET to the worker)
 *
 * --enter replaces what bash, prlimit(1) and setpriv(1) did, three dynamic executables fewer per
 * run. In this order it: joins the run's cgroups (--cgroup-procs FILE, each; before anything can
 * fork), pins itself to the slot's CPUs (--cpus LIST, where no cpuset cgroup does it), moves the
 * report pipe to fd 9 (--report-fd N), sets the run's resource limits (--rlimit NAME=VALUE, soft =
 * hard; cpu, fsize, nofile, core, as, nproc), drops every supplementary group and switches to the
 * sandbox's gid and uid (--gid, --uid; which clears every capability), sets no_new_privs, and execs
 * bwrap. Any failure is a message on stderr and exit 126: no "started" report, so the worker sees a
 * sandbox that did not start (SandboxFailure), never a verdict.
 *
 * Inside, as PID 1 of the run's PID namespace:
 *
 * Writes "started\n" on fd 9, forks, and the child (fd 9 closed) execs the program. When the
 * program ends, every process it left behind is killed and reaped, and the launcher writes
 *
 *   "done <wait status> <user CPU us> <system CPU us> <peak RSS KiB>\n"
 *
 * from getrusage(RUSAGE_CHILDREN): the program's own figures and those of every process it made,
 * nothing of the launch chain before it (bash, prlimit, setpriv, bwrap, this launcher), and no page
 * cache (RSS counts the pages mapped into the program, not the files it read or wrote). Built
 * static, so the child's RSS at exec, which the kernel keeps as a floor of its peak, is a few pages.
 * The program is not PID 1, so it keeps default signal actions (SIGXFSZ past the output limit).
 *
 * --box: the same isolation, built once for all the tests of a submission (bwrap's namespaces and
 * mounts are most of a run's start-up). PID 1 says "ready", then serves one message at a time:
 *
 *   "run\0NAME=VALUE\0...\0--\0PROGRAM\0ARG..." (the test's rlimits, as --rlimit takes them) + 3 fds (SCM_RIGHTS:
 *   the test's stdin, stdout, stderr)  ->  "started", then "done <wait status> <user CPU us> <system
 *   CPU us> <peak RSS KiB>", then "clean" (ready for the next test) or "unclean" (and the box ends)
 *
 * It forks the program with those fds and limits, reaps every process of the namespace (PID 1 is the
 * reaper of every orphan, and cannot be killed from inside), adding up each one's CPU time from
 * wait4 and keeping the largest peak RSS: the test's own figures, nothing of any earlier test. When
 * the program ends, everything it left is killed. Before the next message, what a test could leave
 * for the next one is wiped: the files in /tmp and /dev/shm (the only writable places: / and /dev
 * are remounted read-only, the box directory is bound read-only), System V IPC objects and the
 * user keyrings; POSIX message queues cannot be made at all (RLIMIT_MSGQUEUE 0). The worker closing
 * its end of the socket ends the box.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <grp.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ipc.h>
#include <sys/msg.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/sem.h>
#include <sys/shm.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#define REPORT_FD 9

static void report(const char *text) {
    size_t left = strlen(text);
    while (left > 0) {
        ssize_t n = write(REPORT_FD, text, left);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return;
        text += n;
        left -= (size_t)n;
    }
}

static int fail(const char *what, const char *detail) {
    fprintf(stderr, "judge-launcher: %s%s%s: %s\n", what, detail ? " " : "", detail ? detail : "", strerror(errno));
    return 126;
}

static int parse_number(const char *text, unsigned long long *out) {
    char *end;
    errno = 0;
    *out = strtoull(text, &end, 10);
    return errno == 0 && end != text && *end == '\0' && text[0] != '-';
}

static const struct {
    const char *name;
    int resource;
} LIMITS[] = {{"cpu", RLIMIT_CPU}, {"fsize", RLIMIT_FSIZE}, {"nofile", RLIMIT_NOFILE},
              {"core", RLIMIT_CORE}, {"as", RLIMIT_AS}, {"nproc", RLIMIT_NPROC}};

static int set_limit(const char *spec) {
    const char *eq = strchr(spec, '=');
    unsigned long long value;
    if (eq == NULL || !parse_number(eq + 1, &value)) {
        errno = EINVAL;
        return fail("bad --rlimit", spec);
    }
    for (size_t i = 0; i < sizeof LIMITS / sizeof LIMITS[0]; i++) {
        if (strlen(LIMITS[i].name) == (size_t)(eq - spec) && strncmp(spec, LIMITS[i].name, (size_t)(eq - spec)) == 0) {
            struct rlimit limit = {(rlim_t)value, (rlim_t)value};
            return setrlimit(LIMITS[i].resource, &limit) == 0 ? 0 : fail("setrlimit", spec);
        }
    }
    errno = EINVAL;
    return fail("unknown --rlimit", spec);
}

static int join_cgroup(const char *procs) {
    char pid[32];
    int fd = open(procs, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return fail("cannot open", procs);
    int length = snprintf(pid, sizeof pid, "%d\n", (int)getpid());
    ssize_t written = write(fd, pid, (size_t)length);
    close(fd);
    return written == length ? 0 : fail("cannot join", procs);
}

static int pin(const char *list) {
    cpu_set_t set;
    CPU_ZERO(&set);
    char *copy = strdup(list), *save = NULL;
    for (char *item = strtok_r(copy, ",", &save); item != NULL; item = strtok_r(NULL, ",", &save)) {
        unsigned long long cpu;
        if (!parse_number(item, &cpu) || cpu >= CPU_SETSIZE) {
            free(copy);
            errno = EINVAL;
            return fail("bad --cpus", list);
        }
        CPU_SET((int)cpu, &set);
    }
    free(copy);
    return sched_setaffinity(0, sizeof set, &set) == 0 ? 0 : fail("sched_setaffinity", list);
}

/* The first step, as root: see the top of this file. */
static int enter(int argc, char **argv) {
    unsigned long long uid = 0, gid = 0, report_fd = REPORT_FD;
    int have_uid = 0, have_gid = 0, i = 2;
    for (; i < argc && strcmp(argv[i], "--") != 0; i += 2) {
        const char *option = argv[i], *value = i + 1 < argc ? argv[i + 1] : NULL;
        int ok = value != NULL;
        if (ok && strcmp(option, "--uid") == 0)
            ok = have_uid = parse_number(value, &uid) && uid > 0;
        else if (ok && strcmp(option, "--gid") == 0)
            ok = have_gid = parse_number(value, &gid) && gid > 0;
        else if (ok && strcmp(option, "--report-fd") == 0)
            ok = parse_number(value, &report_fd);
        else if (ok && strcmp(option, "--cgroup-procs") == 0) {
            if (join_cgroup(value) != 0)
                return 126;
        } else if (ok && strcmp(option, "--cpus") == 0) {
            if (pin(value) != 0)
                return 126;
        } else if (ok && strcmp(option, "--rlimit") == 0) {
            if (set_limit(value) != 0)
                return 126;
        } else
            ok = 0;
        if (!ok) {
            fprintf(stderr, "judge-launcher: bad option %s %s\n", option, value ? value : "");
            return 126;
        }
    }
    if (i + 1 >= argc || !have_uid || !have_gid) {
        fprintf(stderr, "judge-launcher: usage: judge-launcher --enter --uid U --gid G [OPTION...] -- PROGRAM [ARG...]\n");
        return 126;
    }
    if (report_fd != REPORT_FD) {
        if (dup2((int)report_fd, REPORT_FD) < 0)
            return fail("dup2 of the report pipe", NULL);
        close((int)report_fd);
    }
    if (setgroups(0, NULL) != 0)
        return fail("setgroups", NULL);
    if (setresgid((gid_t)gid, (gid_t)gid, (gid_t)gid) != 0)
        return fail("setresgid", NULL);
    if (setresuid((uid_t)uid, (uid_t)uid, (uid_t)uid) != 0)
        return fail("setresuid", NULL);
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0)
        return fail("no_new_privs", NULL);
    execv(argv[i + 1], argv + i + 1);
    return fail("cannot run", argv[i + 1]);
}


/* --box: see the top of this file. */
#define BOX_MESSAGE_MAX 65536
#define BOX_MAX_ARGS 256
#define BOX_WIPE_FILES 64

static int box_send(const char *text) {
    for (;;) {
        ssize_t n = send(REPORT_FD, text, strlen(text), MSG_NOSIGNAL);
        if (n >= 0)
            return 0;
        if (errno != EINTR)
            return -1;
    }
}

/* Empties a directory (not the directory itself), whatever modes the program gave what is in it:
 * its owner, this uid, may always make a directory of its own readable and writable again. */
static void empty_directory(int directory) {
    DIR *listing = fdopendir(directory);
    if (listing == NULL) {
        close(directory);
        return;
    }
    struct dirent *entry;
    while ((entry = readdir(listing)) != NULL) {
        if (strcmp(entry->d_name, ".") == 0 || strcmp(entry->d_name, "..") == 0)
            continue;
        if (unlinkat(dirfd(listing), entry->d_name, 0) == 0)
            continue;
        fchmodat(dirfd(listing), entry->d_name, 0700, 0);
        int inner = openat(dirfd(listing), entry->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (inner >= 0) {
            empty_directory(inner);
            unlinkat(dirfd(listing), entry->d_name, AT_REMOVEDIR);
        }
    }
    closedir(listing);
}

/* 0 when the directory ends up empty. */
static int empty_path(const char *path) {
    int directory = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (directory < 0)
        return errno == ENOENT ? 0 : -1;
    empty_directory(directory);
    DIR *listing = opendir(path);
    if (listing == NULL)
        return -1;
    int left = 0;
    struct dirent *entry;
    while ((entry = readdir(listing)) != NULL)
        left += strcmp(entry->d_name, ".") != 0 && strcmp(entry->d_name, "..") != 0;
    closedir(listing);
    return left == 0 ? 0 : -1;
}

/* 0 when no System V IPC object is left (the table lists none after the header). */
static int ipc_table_empty(const char *path) {
    FILE *table = fopen(path, "r");
    if (table == NULL)
        return 0;
    char line[512];
    int lines = 0;
    while (fgets(line, sizeof line, table) != NULL)
        lines++;
    fclose(table);
    return lines <= 1 ? 0 : -1;
}

/* What a test could leave for the next: files in the writable places, System V IPC objects, keys.
 * 0 when nothing is left; otherwise the box ends (the worker starts a new one for the next test). */
static int wipe_between_tests(void) {
    int unclean = empty_path("/tmp") != 0;
    unclean |= empty_path("/dev/shm") != 0;
    static const char *const tables[] = {"/proc/sysvipc/shm", "/proc/sysvipc/sem", "/proc/sysvipc/msg"};
    for (int t = 0; t < 3; t++) {
        FILE *table = fopen(tables[t], "r");
        if (table == NULL)
            continue;
        char line[512];
        if (fgets(line, sizeof line, table) != NULL) { /* the header */
            long key, id;
            while (fscanf(table, "%ld %ld", &key, &id) == 2) {
                if (t == 0)
                    shmctl((int)id, IPC_RMID, NULL);
                else if (t == 1)
                    semctl((int)id, 0, IPC_RMID);
                else
                    msgctl((int)id, IPC_RMID, NULL);
                if (fgets(line, sizeof line, table) == NULL)
                    break;
            }
        }
        fclose(table);
        unclean |= ipc_table_empty(tables[t]) != 0;
    }
    syscall(SYS_keyctl, 7 /* KEYCTL_CLEAR */, -4 /* KEY_SPEC_USER_KEYRING */);
    syscall(SYS_keyctl, 7 /* KEYCTL_CLEAR */, -5 /* KEY_SPEC_USER_SESSION_KEYRING */);
    return unclean ? -1 : 0;
}

/* One test: fork the program on the given fds, reap the whole namespace, report. */
static void box_run_test(char **fields, int count, const int fds[3]) {
    int program = 1; /* the field after "--": the rlimits come before it */
    while (program < count && strcmp(fields[program], "--") != 0)
        program++;
    program++;
    if (program >= count) {
        box_send("error bad run message");
        return;
    }
    pid_t child = fork();
    if (child < 0) {
        char line[128];
        snprintf(line, sizeof line, "error fork: %s", strerror(errno));
        box_send(line);
        return;
    }
    if (child == 0) {
        if (dup2(fds[0], 0) < 0 || dup2(fds[1], 1) < 0 || dup2(fds[2], 2) < 0)
            _exit(126);
        for (int fd = 3; fd < 1024; fd++)
            close(fd);
        for (int i = 1; i < program - 1; i++)
            if (set_limit(fields[i]) != 0)
                _exit(126); /* set_limit said why, on the test's stderr */
        execvp(fields[program], fields + program);
        fprintf(stderr, "judge-launcher: cannot run %s: %s\n", fields[program], strerror(errno));
        _exit(errno == ENOENT ? 127 : 126);
    }
    for (int i = 0; i < 3; i++)
        close(fds[i]); /* the program's copies are the only ones: its output pipes end with it */
    box_send("started");
    int status = 0;
    long long user_us = 0, system_us = 0;
    long peak_kb = 0;
    for (;;) {
        int st;
        struct rusage usage;
        pid_t pid = wait4(-1, &st, 0, &usage);
        if (pid < 0) {
            if (errno == EINTR)
                continue;
            break; /* ECHILD: nothing of this test is left in the namespace */
        }
        /* Each reaped process's own figures (with those of the children it reaped itself). */
        user_us += (long long)usage.ru_utime.tv_sec * 1000000 + usage.ru_utime.tv_usec;
        system_us += (long long)usage.ru_stime.tv_sec * 1000000 + usage.ru_stime.tv_usec;
        if (usage.ru_maxrss > peak_kb)
            peak_kb = usage.ru_maxrss;
        if (pid == child) {
            status = st;
            kill(-1, SIGKILL); /* every process but PID 1: whatever the program left running */
        }
    }
    char line[128];
    snprintf(line, sizeof line, "done %d %lld %lld %ld", status, user_us, system_us, peak_kb);
    box_send(line);
}

static int box(void) {
    /* No POSIX message queue can be made: their names outlive processes and cannot be listed here. */
    struct rlimit no_queues = {0, 0};
    if (setrlimit(RLIMIT_MSGQUEUE, &no_queues) != 0)
        return fail("setrlimit msgqueue", NULL);
    /* The wipe holds a descriptor per directory level: a tree deeper than this is left, and the box
     * ends (a known bound, rather than whatever the worker's own limit happens to be). */
    struct rlimit files;
    if (getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur > BOX_WIPE_FILES) {
        files.rlim_cur = BOX_WIPE_FILES;
        setrlimit(RLIMIT_NOFILE, &files);
    }
    if (box_send("ready") != 0)
        return fail("report", NULL);
    static char buffer[BOX_MESSAGE_MAX + 1];
    for (;;) {
        union {
            char space[CMSG_SPACE(3 * sizeof(int))];
            struct cmsghdr align;
        } control;
        struct iovec iov = {buffer, BOX_MESSAGE_MAX};
        struct msghdr message = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.space,
                                 .msg_controllen = sizeof control.space};
        ssize_t n = recvmsg(REPORT_FD, &message, MSG_CMSG_CLOEXEC);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return 0; /* the worker closed its end: the box is done */
        int fds[3] = {-1, -1, -1}, received = 0;
        for (struct cmsghdr *c = CMSG_FIRSTHDR(&message); c != NULL; c = CMSG_NXTHDR(&message, c)) {
            if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
                int count = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
                int *given = (int *)CMSG_DATA(c);
                for (int i = 0; i < count; i++) {
                    if (received < 3)
                        fds[received++] = given[i];
                    else
                        close(given[i]);
                }
            }
        }
        buffer[n] = '\0';
        char *fields[BOX_MAX_ARGS + 1];
        int count = 0;
        for (char *p = buffer; p < buffer + n && count < BOX_MAX_ARGS; p += strlen(p) + 1)
            fields[count++] = p;
        fields[count] = NULL;
        if (received != 3 || (message.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) || count < 1 ||
            strcmp(fields[0], "run") != 0) {
            for (int i = 0; i < received; i++)
                close(fds[i]);
            box_send("error bad message");
            continue;
        }
        box_run_test(fields, count, fds);
        if (wipe_between_tests() != 0) {
            box_send("unclean");
            return 0;
        }
        box_send("clean");
    }
}

int main(int argc, char **argv) {
    if (argc >= 2 && strcmp(argv[1], "--enter") == 0)
        return enter(argc, argv);
    if (argc == 2 && strcmp(argv[1], "--box") == 0)
        return box();
    if (argc < 3 || strcmp(argv[1], "--") != 0) {
        fprintf(stderr, "judge-launcher: usage: judge-launcher -- PROGRAM [ARG...]\n");
        return 126;
    }
    report("started\n");
    pid_t child = fork();
    if (child < 0) {
        fprintf(stderr, "judge-launcher: fork: %s\n", strerror(errno));
        return 126;
    }
    if (child == 0) {
        close(REPORT_FD);
        execvp(argv[2], argv + 2);
        fprintf(stderr, "judge-launcher: cannot run %s: %s\n", argv[2], strerror(errno));
        _exit(errno == ENOENT ? 127 : 126);
    }
    int status = 0;
    while (waitpid(child, &status, 0) < 0) {
        if (errno != EINTR)
            return 126;
    }
    /* Whatever the program left running would otherwise escape its CPU figure. */
    kill(-1, SIGKILL);
    while (wait(NULL) > 0 || errno == EINTR)
        ;
    struct rusage usage;
    getrusage(RUSAGE_CHILDREN, &usage);
    char line[128];
    snprintf(line, sizeof line, "done %d %lld %lld %ld\n", status,
             (long long)usage.ru_utime.tv_sec * 1000000 + usage.ru_utime.tv_usec,
             (long long)usage.ru_stime.tv_sec * 1000000 + usage.ru_stime.tv_usec, usage.ru_maxrss);
    report(line);
    return 0;
}
