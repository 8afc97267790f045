"""The seccomp allow-list every candidate runs under, compiled once in the trusted worker.

Namespaces hide the host's objects, but some kernel state is not namespaced at all (the keyring
of a uid, vsock's port space) and some calls open a large kernel surface (a nested user
namespace with full capabilities, io_uring, bpf). So the candidate may make only the system calls
an ordinary Python program makes; anything else fails with EPERM (Python sees an OSError, the
run goes on and scores what it prints). Among those allowed, two are narrowed by argument:
- `socket`/`socketpair`: AF_UNIX only (inet, inet6, netlink, vsock, packet are refused, through
  ctypes as well as through the socket module);
- `clone`: no namespace flag (no new user, mount, network, PID... namespace); `clone3`, whose
  flags live in memory a filter cannot read, fails with ENOSYS, so the C library falls back to
  `clone`.
Left out on purpose, among others: ptrace, process_vm_readv/writev, pidfd_getfd, kcmp (no reading
another process: the runner); add_key, keyctl, request_key (the keyring); unshare, setns; mount,
umount2, pivot_root, chroot and the new mount API; bpf, perf_event_open, userfaultfd, io_uring;
personality; seccomp itself.

libseccomp (through `pyseccomp`, a ctypes binding of the system's libseccomp.so.2) compiles the
list into a classic BPF program for this machine's architecture (other ABIs, such as i386 calls
from x86_64, kill the process). The runner loads that program (prctl PR_SET_SECCOMP) before any
candidate code exists, on every backend; it fails closed: a runner that cannot load it never runs
the candidate, and a worker that cannot compile it refuses runs (`FilterUnavailable`).
"""

from __future__ import annotations

import contextlib
import errno
import tempfile
from functools import cache

_ALLOWED = """
accept accept4 access alarm arch_prctl bind brk capget chdir chmod chown clock_getres
clock_gettime clock_nanosleep close close_range connect copy_file_range creat dup dup2 dup3
epoll_create epoll_create1 epoll_ctl epoll_pwait epoll_pwait2 epoll_wait eventfd eventfd2 execve
execveat exit exit_group faccessat faccessat2 fadvise64 fallocate fchdir fchmod fchmodat fchown
fchownat fcntl fdatasync fgetxattr flistxattr flock fork fremovexattr fsetxattr fstat fstatfs
fsync ftruncate futex futex_waitv futimesat get_mempolicy get_robust_list getcpu getcwd getdents
getdents64 getegid geteuid getgid getgroups getitimer getpeername getpgid getpgrp getpid getppid
getpriority getrandom getresgid getresuid getrlimit getrusage getsid getsockname getsockopt
gettid gettimeofday getuid getxattr inotify_add_watch inotify_init inotify_init1
inotify_rm_watch ioctl kill lchown lgetxattr link linkat listen listxattr llistxattr
lremovexattr lseek lsetxattr lstat madvise mbind membarrier memfd_create mincore mkdir mkdirat
mknod mknodat mlock mlock2 mlockall mmap mprotect mremap msync munlock munlockall munmap
nanosleep newfstatat open openat openat2 pause pidfd_open pidfd_send_signal pipe pipe2 poll
ppoll prctl pread64 preadv preadv2 prlimit64 pselect6 pwrite64 pwritev pwritev2 read readahead
readlink readlinkat readv recvfrom recvmmsg recvmsg removexattr rename renameat renameat2
restart_syscall rmdir rseq rt_sigaction rt_sigpending rt_sigprocmask rt_sigqueueinfo rt_sigreturn
rt_sigsuspend rt_sigtimedwait rt_tgsigqueueinfo sched_get_priority_max sched_get_priority_min
sched_getaffinity sched_getattr sched_getparam sched_getscheduler sched_rr_get_interval
sched_setaffinity sched_yield select setrlimit sendfile sendmmsg sendmsg sendto set_mempolicy
set_robust_list set_tid_address setitimer setpgid setsid setsockopt shutdown sigaltstack
signalfd signalfd4 splice stat statfs statx symlink symlinkat sync sync_file_range syncfs sysinfo
tee tgkill time timer_create timer_delete timer_getoverrun timer_gettime timer_settime
timerfd_create timerfd_gettime timerfd_settime times tkill truncate umask uname unlink unlinkat
utime utimensat utimes vfork vmsplice wait4 waitid write writev
"""
ALLOWED = _ALLOWED.split()
AF_UNIX = 1
# CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET | NEWTIME
CLONE_NAMESPACES = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 \
    | 0x20000000 | 0x40000000 | 0x00000080


class FilterUnavailable(RuntimeError):
    """libseccomp is missing or refused the filter: candidates must not run."""


@cache
def program() -> bytes:
    """The allow-list as a BPF program (an array of struct sock_filter) for this machine."""
    try:
        import pyseccomp as sc
    except (ImportError, OSError) as exc:  # the package, or the libseccomp.so.2 it loads
        raise FilterUnavailable(
            f"seccomp filter unavailable ({exc}): install libseccomp2 (Debian: `apt-get install "
            "libseccomp2`) and the pyseccomp package") from exc
    try:
        f = sc.SyscallFilter(sc.ERRNO(errno.EPERM))
        with contextlib.suppress(OSError):  # libseccomp >= 2.5: a binary tree, not a list
            f.set_attr(sc.Attr.CTL_OPTIMIZE, 2)
        arch = sc.system_arch()
        for name in ALLOWED:
            if sc.resolve_syscall(arch, name) >= 0:  # else a call this architecture lacks
                f.add_rule(sc.ALLOW, name)
        for call in ("socket", "socketpair"):
            f.add_rule(sc.ALLOW, call, sc.Arg(0, sc.EQ, AF_UNIX))
        f.add_rule(sc.ALLOW, "clone", sc.Arg(0, sc.MASKED_EQ, CLONE_NAMESPACES, 0))
        f.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
        with tempfile.TemporaryFile() as out:
            f.export_bpf(out)
            out.seek(0)
            return out.read()
    except OSError as exc:
        raise FilterUnavailable(f"seccomp filter could not be compiled: {exc}") from exc


def available() -> str:
    """'' when the filter compiles here, else why not."""
    try:
        program()
    except FilterUnavailable as exc:
        return str(exc)
    return ""
