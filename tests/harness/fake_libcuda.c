/* A stand-in for libcuda's process checkpoint API, for machines without a GPU (CI).
 *
 * It is the other side of gpuctx_jupyter/core/checkpoint.py's ctypes calls: the same symbols and
 * signatures, the same state machine (running -> locked -> checkpointed -> locked -> running), the
 * same error codes as driver 580 gave on an H200 (benchmarks/results/2026-12-02-h200, the probe), so
 * that the real helper process, the server's suspend logic and the kernel's resume-before-dispatch
 * run unchanged. It moves no memory: a process's state is a file,
 * $GPUCTX_FAKE_CUDA_DIR/<pid>, shared by every process that loads this library. A process
 * without that file has not started CUDA. Tests steer it with files beside it:
 *   <pid>.fail.<step>  "<CUresult> [<state left> [<times>]]": that step fails (once, or <times>
 *                      times; then the file is removed; a state left of -1 leaves it unchanged)
 *   <pid>.busy         the process is inside a CUDA call: lock waits its timeout, then fails with
 *                      CUDA_ERROR_NOT_READY and leaves it running (as the driver did)
 *   <pid>.hang.<step>  that step does not return while the file exists (a driver call that hangs);
 *                      <pid>.hanging.<step> exists while one waits there
 * and read what happened in $GPUCTX_FAKE_CUDA_DIR/log, one line per call:
 * "<step> <pid> <result> <epoch seconds>".
 * What the driver answered, and so what this answers: a step from the wrong state ILLEGAL_STATE;
 * a process without CUDA (no state file) NOT_INITIALIZED; an ended process, or one the caller may
 * not act on (another user's), OPERATING_SYSTEM; cuInit with CUDA_VISIBLE_DEVICES="" NO_DEVICE.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <time.h>
#include <unistd.h>

enum { SUCCESS = 0, INVALID_VALUE = 1, OUT_OF_MEMORY = 2, NOT_INITIALIZED = 3, NO_DEVICE = 100,
       OPERATING_SYSTEM = 304, ILLEGAL_STATE = 401, NOT_READY = 600, NOT_SUPPORTED = 801 };
enum { RUNNING = 0, LOCKED = 1, CHECKPOINTED = 2, FAILED = 3 };

static const char *dir(void) {
    const char *d = getenv("GPUCTX_FAKE_CUDA_DIR");
    return d ? d : "/tmp/gpuctx-fake-cuda";
}

static void path(char *out, size_t n, int pid, const char *suffix) {
    snprintf(out, n, "%s/%d%s", dir(), pid, suffix);
}

static int read_state(int pid) {
    char p[512];
    path(p, sizeof p, pid, "");
    FILE *f = fopen(p, "r");
    if (!f) return -1;
    int s = -1;
    if (fscanf(f, "%d", &s) != 1) s = -1;
    fclose(f);
    return s;
}

static void write_state(int pid, int state) {
    char p[512], tmp[520];
    path(p, sizeof p, pid, "");
    snprintf(tmp, sizeof tmp, "%s.tmp", p);
    FILE *f = fopen(tmp, "w");
    if (!f) return;
    fprintf(f, "%d\n", state);
    fclose(f);
    rename(tmp, p);
}

static int log_result(const char *step, int pid, int result) {
    char p[512];
    snprintf(p, sizeof p, "%s/log", dir());
    FILE *f = fopen(p, "a");
    if (f) {
        flock(fileno(f), LOCK_EX);
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        fprintf(f, "%s %d %d %.6f\n", step, pid, result, ts.tv_sec + ts.tv_nsec / 1e9);
        fclose(f);
    }
    return result;
}

/* A failure the test asked for: its code, and the state it leaves (or -1: unchanged). */
static int planned_failure(int pid, const char *step, int *leave) {
    char p[512];
    char suffix[64];
    snprintf(suffix, sizeof suffix, ".fail.%s", step);
    path(p, sizeof p, pid, suffix);
    FILE *f = fopen(p, "r");
    if (!f) return 0;
    int code = 0, times = 1;
    *leave = -1;
    if (fscanf(f, "%d %d %d", &code, leave, &times) < 1) code = NOT_SUPPORTED;
    fclose(f);
    if (times > 1) { /* fails again, as often as asked */
        f = fopen(p, "w");
        if (f) { fprintf(f, "%d %d %d", code, *leave, times - 1); fclose(f); }
    } else {
        unlink(p);
    }
    return code;
}

/* The driver's answer for a pid it cannot act on (0: none): ended or another user's. */
static int unreachable(int pid) {
    if (pid <= 0) return INVALID_VALUE;
    if (kill(pid, 0) != 0 && (errno == ESRCH || errno == EPERM)) return OPERATING_SYSTEM;
    return 0;
}

static int initialized = 0;

/* A hang the test asked for: wait while <pid>.hang.<step> exists, saying so in <pid>.hanging.<step>. */
static void planned_hang(int pid, const char *step) {
    char p[512], marker[512];
    char suffix[64];
    snprintf(suffix, sizeof suffix, ".hang.%s", step);
    path(p, sizeof p, pid, suffix);
    if (access(p, F_OK) != 0) return;
    snprintf(suffix, sizeof suffix, ".hanging.%s", step);
    path(marker, sizeof marker, pid, suffix);
    FILE *f = fopen(marker, "w");
    if (f) fclose(f);
    struct timespec ts = { 0, 20 * 1000000L };
    while (access(p, F_OK) == 0) nanosleep(&ts, NULL);
    unlink(marker);
}

static int transition(const char *step, int pid, int from, int to) {
    if (!initialized) return log_result(step, pid, NOT_INITIALIZED);
    planned_hang(pid, step);
    int gone = unreachable(pid);
    if (gone) return log_result(step, pid, gone);
    int state = read_state(pid);
    if (state < 0) return log_result(step, pid, NOT_INITIALIZED);
    int leave, code = planned_failure(pid, step, &leave);
    if (code) {
        if (leave >= 0) write_state(pid, leave);
        return log_result(step, pid, code);
    }
    if (state != from) return log_result(step, pid, ILLEGAL_STATE);
    write_state(pid, to);
    return log_result(step, pid, SUCCESS);
}

int cuInit(unsigned int flags) {
    (void)flags;
    const char *visible = getenv("CUDA_VISIBLE_DEVICES");
    if (visible && !*visible) return NO_DEVICE; /* every GPU hidden: the driver finds none */
    initialized = 1;
    return SUCCESS;
}

int cuDriverGetVersion(int *version) { *version = 13000; return SUCCESS; }

int cuGetErrorName(int error, const char **name) {
    switch (error) {
    case SUCCESS: *name = "CUDA_SUCCESS"; return SUCCESS;
    case INVALID_VALUE: *name = "CUDA_ERROR_INVALID_VALUE"; return SUCCESS;
    case OUT_OF_MEMORY: *name = "CUDA_ERROR_OUT_OF_MEMORY"; return SUCCESS;
    case NOT_INITIALIZED: *name = "CUDA_ERROR_NOT_INITIALIZED"; return SUCCESS;
    case NO_DEVICE: *name = "CUDA_ERROR_NO_DEVICE"; return SUCCESS;
    case OPERATING_SYSTEM: *name = "CUDA_ERROR_OPERATING_SYSTEM"; return SUCCESS;
    case ILLEGAL_STATE: *name = "CUDA_ERROR_ILLEGAL_STATE"; return SUCCESS;
    case NOT_READY: *name = "CUDA_ERROR_NOT_READY"; return SUCCESS;
    case NOT_SUPPORTED: *name = "CUDA_ERROR_NOT_SUPPORTED"; return SUCCESS;
    }
    *name = NULL;
    return INVALID_VALUE;
}

int cuGetErrorString(int error, const char **text) {
    switch (error) {
    case SUCCESS: *text = "no error"; return SUCCESS;
    case INVALID_VALUE: *text = "invalid argument"; return SUCCESS;
    case OUT_OF_MEMORY: *text = "out of memory"; return SUCCESS;
    case NOT_INITIALIZED: *text = "initialization error"; return SUCCESS;
    case NO_DEVICE: *text = "no CUDA-capable device is detected"; return SUCCESS;
    case OPERATING_SYSTEM: *text = "OS call failed or operation not supported on this OS"; return SUCCESS;
    case ILLEGAL_STATE: *text = "the operation cannot be performed in the present state"; return SUCCESS;
    case NOT_READY: *text = "device not ready"; return SUCCESS;
    case NOT_SUPPORTED: *text = "operation not supported"; return SUCCESS;
    }
    *text = NULL;
    return INVALID_VALUE;
}

int cuCheckpointProcessGetState(int pid, int *state) {
    if (!initialized) return log_result("state", pid, NOT_INITIALIZED);
    int gone = unreachable(pid);
    if (gone) return log_result("state", pid, gone);
    int s = read_state(pid);
    if (s < 0) return log_result("state", pid, NOT_INITIALIZED);
    *state = s;
    return SUCCESS; /* not logged: it is asked often */
}

struct lock_args { unsigned int timeout_ms; unsigned int reserved0; unsigned long long reserved1[7]; };

int cuCheckpointProcessLock(int pid, struct lock_args *args) {
    char p[512];
    path(p, sizeof p, pid, ".busy");
    if (initialized && access(p, F_OK) == 0 && read_state(pid) == RUNNING) {
        unsigned int ms = args ? args->timeout_ms : 0;
        if (ms == 0) ms = 60000; /* "no timeout": the real call would wait for ever */
        struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };
        nanosleep(&ts, NULL);
        return log_result("lock", pid, NOT_READY);
    }
    return transition("lock", pid, RUNNING, LOCKED);
}

int cuCheckpointProcessCheckpoint(int pid, void *args) { (void)args; return transition("checkpoint", pid, LOCKED, CHECKPOINTED); }

int cuCheckpointProcessRestore(int pid, void *args) { (void)args; return transition("restore", pid, CHECKPOINTED, LOCKED); }

int cuCheckpointProcessUnlock(int pid, void *args) { (void)args; return transition("unlock", pid, LOCKED, RUNNING); }
