/*
 * Make a process on an AVX-512 x86-64 CPU see an AVX2-only CPU, for benchmarks.
 *
 * ONNX Runtime (MLAS), numpy and oneDNN pick their kernels from the CPUID instruction;
 * only some of them honour an environment variable. Linux's CPUID faulting
 * (arch_prctl ARCH_SET_CPUID, the "cpuid_fault" flag in /proc/cpuinfo) makes every
 * CPUID of this process trap; the SIGSEGV handler below answers it with the real
 * values minus the AVX-512, AVX-VNNI and AMX feature bits, so each library dispatches
 * the kernels it would run on an AVX2 CPU (a Zen 2/3 EPYC, a Haswell..Ice Lake client
 * without AVX-512), on the same cores and clocks.
 *
 * Use: bash benchmarks/avx2.sh COMMAND (builds this file once and preloads it; Linux x86-64).
 * CPUID faulting is inherited by threads and forks and reset by execve, so every
 * process that should see AVX2 needs the preload (child processes inherit LD_PRELOAD).
 * Libraries that read CPUID before this constructor runs (glibc's own string
 * functions) keep what they saw. benchmarks/rounds.py's cpu_note says whether the
 * masking reached the process it runs in.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

#ifndef ARCH_GET_CPUID
#define ARCH_GET_CPUID 0x1011
#define ARCH_SET_CPUID 0x1012
#endif

static void real_cpuid(uint32_t leaf, uint32_t subleaf, uint32_t out[4]) {
    __asm__ volatile("cpuid"
                     : "=a"(out[0]), "=b"(out[1]), "=c"(out[2]), "=d"(out[3])
                     : "a"(leaf), "c"(subleaf));
}

static void mask_to_avx2(uint32_t leaf, uint32_t subleaf, uint32_t r[4]) {
    if (leaf == 7 && subleaf == 0) {
        /* EBX: AVX512F 16, DQ 17, IFMA 21, PF 26, ER 27, CD 28, BW 30, VL 31 */
        r[1] &= ~((1u << 16) | (1u << 17) | (1u << 21) | (1u << 26) | (1u << 27) |
                  (1u << 28) | (1u << 30) | (1u << 31));
        /* ECX: VBMI 1, VBMI2 6, VNNI 11, BITALG 12, VPOPCNTDQ 14 */
        r[2] &= ~((1u << 1) | (1u << 6) | (1u << 11) | (1u << 12) | (1u << 14));
        /* EDX: 4VNNIW 2, 4FMAPS 3, VP2INTERSECT 8, AMX-BF16 22, FP16 23, AMX-TILE 24, AMX-INT8 25 */
        r[3] &= ~((1u << 2) | (1u << 3) | (1u << 8) | (1u << 22) | (1u << 23) | (1u << 24) |
                  (1u << 25));
    } else if (leaf == 7 && subleaf == 1) {
        /* EAX: AVX-VNNI 4, AVX512-BF16 5, AMX-FP16 21; EDX: AVX-VNNI-INT8 4, AVX10 19 */
        r[0] &= ~((1u << 4) | (1u << 5) | (1u << 21));
        r[3] &= ~((1u << 4) | (1u << 19));
    } else if (leaf == 0xD && subleaf == 0) {
        /* Supported XSAVE state: drop opmask/ZMM (5-7) and AMX tile (17-18) components. */
        r[0] &= ~((1u << 5) | (1u << 6) | (1u << 7) | (1u << 17) | (1u << 18));
    }
}

/* The program's own SIGSEGV disposition. Ours stays installed; a program that installs a
 * SIGSEGV handler after us (Python's faulthandler, which pytest enables) gets it recorded here and
 * called for every fault that is not a CPUID, so its tracebacks and crashes behave as without us. */
static struct sigaction program_segv;
static int masking;

static int (*next_sigaction)(int, const struct sigaction *, struct sigaction *);
static sighandler_t (*next_signal)(int, sighandler_t);

static int call_next_sigaction(int signo, const struct sigaction *action, struct sigaction *old) {
    if (!next_sigaction) next_sigaction = dlsym(RTLD_NEXT, "sigaction");
    return next_sigaction(signo, action, old);
}

int sigaction(int signo, const struct sigaction *action, struct sigaction *old) {
    if (signo != SIGSEGV || !masking) return call_next_sigaction(signo, action, old);
    if (old) *old = program_segv;
    if (action) program_segv = *action;
    return 0;
}

sighandler_t signal(int signo, sighandler_t handler) {
    if (!next_signal) next_signal = dlsym(RTLD_NEXT, "signal");
    if (signo != SIGSEGV || !masking) return next_signal(signo, handler);
    sighandler_t old = (program_segv.sa_flags & SA_SIGINFO) ? SIG_DFL : program_segv.sa_handler;
    memset(&program_segv, 0, sizeof program_segv);
    program_segv.sa_handler = handler;
    return old;
}

static void on_segv(int signo, siginfo_t *info, void *context) {
    ucontext_t *uc = (ucontext_t *)context;
    greg_t *g = uc->uc_mcontext.gregs;
    const unsigned char *pc = (const unsigned char *)g[REG_RIP];
    /* A faulting CPUID arrives as SI_KERNEL with the instruction pointer on its 0F A2. */
    if (info->si_code == SI_KERNEL && pc[0] == 0x0F && pc[1] == 0xA2) {
        uint32_t leaf = (uint32_t)g[REG_RAX], subleaf = (uint32_t)g[REG_RCX], r[4];
        syscall(SYS_arch_prctl, ARCH_SET_CPUID, 1);
        real_cpuid(leaf, subleaf, r);
        syscall(SYS_arch_prctl, ARCH_SET_CPUID, 0);
        mask_to_avx2(leaf, subleaf, r);
        g[REG_RAX] = r[0];
        g[REG_RBX] = r[1];
        g[REG_RCX] = r[2];
        g[REG_RDX] = r[3];
        g[REG_RIP] += 2;
        return;
    }
    /* Any other SIGSEGV is the program's: its handler, or the default action (a crash). */
    int sent = info->si_code <= 0; /* kill/raise, not a fault of the interrupted instruction */
    if ((program_segv.sa_flags & SA_SIGINFO) && program_segv.sa_sigaction) {
        program_segv.sa_sigaction(signo, info, context);
    } else if (!(program_segv.sa_flags & SA_SIGINFO) && program_segv.sa_handler != SIG_DFL &&
               program_segv.sa_handler != SIG_IGN) {
        program_segv.sa_handler(signo);
    } else if (!(sent && program_segv.sa_handler == SIG_IGN)) {
        /* The default, and for a real fault also when ignored: the kernel does not let a program
         * ignore its own faults (returning would re-run the instruction forever). */
        struct sigaction fallback;
        memset(&fallback, 0, sizeof fallback);
        fallback.sa_handler = SIG_DFL;
        masking = 0;
        call_next_sigaction(SIGSEGV, &fallback, NULL);
        /* a fault re-runs its instruction on return and meets the default; a sent signal must be sent again */
        if (sent) raise(SIGSEGV);
    }
}

__attribute__((constructor)) static void cpuid_avx2_start(void) {
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_sigaction = on_segv;
    action.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&action.sa_mask);
    if (call_next_sigaction(SIGSEGV, &action, &program_segv) != 0) {
        perror("cpuid_avx2: sigaction");
        return;
    }
    if (syscall(SYS_arch_prctl, ARCH_SET_CPUID, 0) != 0) {
        perror("cpuid_avx2: this CPU or kernel has no CPUID faulting; nothing is masked");
        call_next_sigaction(SIGSEGV, &program_segv, NULL);
        return;
    }
    masking = 1;
}
