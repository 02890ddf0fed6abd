//! Every call into the operating system that Rust's standard library does not offer:
//! signal handlers and their self-pipe, the command's process group and parent-death
//! signal, the watchdog process, reaping. The only module with `unsafe` (each block says
//! why it is sound); the rest of the tool uses the safe functions here.
//!
//! # Invariants
//!
//! - The signal handler only touches atomics and `write(2)`s one byte to the self-pipe
//!   (async-signal-safe), and restores `errno`.
//! - The watchdog is forked while the process has one thread, and after the fork only
//!   calls async-signal-safe functions (`setpgid`, `sigaction`, `open`, `dup2`,
//!   `close`, `read`, `ppoll`, `clock_gettime`, `kill`, `_exit`, and the raw
//!   `pidfd_open` system call) on stack data and atomics in the shared page.
//! - Every descriptor made here is close-on-exec: the command never inherits the
//!   self-pipe or the watchdog's pipe.
//! - The watchdog learns the command's process group from the command itself, between
//!   fork and exec: from the moment anything of the command runs, a dead quorumlock
//!   means a killed group.
//! - The watchdog also holds the moment by which the group must be gone (the lock's
//!   validity deadline less a margin), which quorumlock moves with every extend: a
//!   quorumlock that is alive but cannot act (SIGSTOP, starved of CPU) cannot let the
//!   command outlive the lock either.
//! - The watchdog notes when the command's process exited (a pidfd on Linux, which
//!   becomes readable at the exit, zombie or not), in the shared page: the moment it
//!   noticed, never earlier than the exit. quorumlock, stopped while the command ended,
//!   learns from it that the command ended while the lock was still valid.
//! - quorumlock ignores the job-control stops (SIGTSTP, SIGTTIN, SIGTTOU): stopped, it
//!   could neither keep the lock alive nor stop the command, which runs on in its own
//!   group. The command gets them back as quorumlock found them.

#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::task::{Wake, Waker};
use std::time::{Duration, Instant};

pub use libc::{SIGKILL, SIGTERM};

/// The signals forwarded to the command, in the order they are checked.
pub const FORWARDED: [i32; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

/// Set by the handler, per signal of [`FORWARDED`]; cleared by [`Signals::take`].
static PENDING: [AtomicBool; 3] = [
    AtomicBool::new(false),
    AtomicBool::new(false),
    AtomicBool::new(false),
];
/// The job-control signals that would stop quorumlock (see the module docs).
const JOB_STOPS: [i32; 3] = [libc::SIGTSTP, libc::SIGTTIN, libc::SIGTTOU];

/// Per signal of [`JOB_STOPS`]: whether quorumlock found it at its default action (so
/// the command gets it back at default; one found ignored stays ignored).
static STOP_WAS_DEFAULT: [AtomicBool; 3] = [
    AtomicBool::new(false),
    AtomicBool::new(false),
    AtomicBool::new(false),
];

/// The write end of the self-pipe (-1 before [`Signals::install`]).
static WAKE_FD: AtomicI32 = AtomicI32::new(-1);

extern "C" fn on_signal(sig: libc::c_int) {
    // SAFETY: `__errno_location` returns this thread's errno slot, always valid.
    let errno = unsafe { *libc::__errno_location() };
    if let Some(i) = FORWARDED.iter().position(|&s| s == sig) {
        PENDING[i].store(true, Ordering::SeqCst);
    }
    poke();
    // SAFETY: as above; restoring errno keeps the interrupted code's view intact.
    unsafe { *libc::__errno_location() = errno };
}

/// Wakes [`Signals::wait`]: one byte into the self-pipe. Async-signal-safe.
fn poke() {
    let fd = WAKE_FD.load(Ordering::SeqCst);
    if fd >= 0 {
        let byte = 1u8;
        // SAFETY: `fd` is the self-pipe's non-blocking write end, open for the process's
        // life; writing one byte from a valid stack address. A full pipe (EAGAIN) is
        // fine: the reader is already due to wake.
        unsafe { libc::write(fd, (&raw const byte).cast(), 1) };
    }
}

fn last_error<T>(what: &str) -> io::Result<T> {
    let e = io::Error::last_os_error();
    Err(io::Error::new(e.kind(), format!("{what}: {e}")))
}

/// A pipe with both ends close-on-exec; the ends optionally non-blocking.
fn pipe(nonblocking: bool) -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    let flags = libc::O_CLOEXEC | if nonblocking { libc::O_NONBLOCK } else { 0 };
    // SAFETY: `fds` is a valid array of two ints for pipe2 to fill.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), flags) } != 0 {
        return last_error("pipe");
    }
    // SAFETY: pipe2 succeeded: both descriptors are open and owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// SIGINT, SIGTERM, SIGHUP (to forward) and SIGCHLD (a child changed state) caught,
/// each waking [`Signals::wait`] through a self-pipe.
pub struct Signals {
    read: OwnedFd,
    _write: OwnedFd,
}

impl Signals {
    /// Creates the self-pipe and installs the handlers (for the process's life); ignores
    /// the job-control stops.
    pub fn install() -> io::Result<Signals> {
        let (read, write) = pipe(true)?;
        WAKE_FD.store(write.as_raw_fd(), Ordering::SeqCst);
        for sig in FORWARDED.into_iter().chain([libc::SIGCHLD]) {
            // SAFETY: a zeroed sigaction is a valid "no flags, empty mask" value; the
            // handler is an `extern "C" fn(c_int)` that only does async-signal-safe
            // work; SA_RESTART keeps other threads' blocking calls from failing.
            let rc = unsafe {
                let mut sa: libc::sigaction = std::mem::zeroed();
                sa.sa_sigaction = on_signal as *const () as libc::sighandler_t;
                sa.sa_flags = libc::SA_RESTART;
                libc::sigemptyset(&mut sa.sa_mask);
                libc::sigaction(sig, &sa, std::ptr::null_mut())
            };
            if rc != 0 {
                return last_error("sigaction");
            }
        }
        for (sig, was_default) in JOB_STOPS.into_iter().zip(&STOP_WAS_DEFAULT) {
            // SAFETY: a zeroed sigaction with SIG_IGN is a valid "ignore" action; the old
            // one is written to a valid stack value.
            let (rc, old) = unsafe {
                let mut sa: libc::sigaction = std::mem::zeroed();
                let mut old: libc::sigaction = std::mem::zeroed();
                sa.sa_sigaction = libc::SIG_IGN;
                let rc = libc::sigaction(sig, &sa, &mut old);
                (rc, old)
            };
            if rc != 0 {
                return last_error("sigaction");
            }
            was_default.store(old.sa_sigaction == libc::SIG_DFL, Ordering::SeqCst);
        }
        Ok(Signals {
            read,
            _write: write,
        })
    }

    /// The forwarded signals received since the last call, in [`FORWARDED`] order.
    pub fn take(&self) -> Vec<i32> {
        FORWARDED
            .iter()
            .zip(&PENDING)
            .filter(|(_, p)| p.swap(false, Ordering::SeqCst))
            .map(|(&s, _)| s)
            .collect()
    }

    /// Sleeps until a signal arrives, a [`Signals::waker`] is woken, or `timeout`
    /// passes; then empties the self-pipe.
    pub fn wait(&self, timeout: Duration) {
        let mut pfd = libc::pollfd {
            fd: self.read.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // Round up: a wait of 0.4 ms must not become a busy loop of zero waits.
        let ms = timeout.as_micros().div_ceil(1000).min(60_000) as libc::c_int;
        // SAFETY: one valid pollfd on the stack; EINTR (a signal) just returns early.
        unsafe { libc::poll(&mut pfd, 1, ms) };
        let mut buf = [0u8; 64];
        // SAFETY: reading into a stack buffer of its length from our non-blocking read
        // end, until it is empty (EAGAIN) or fails.
        while unsafe { libc::read(pfd.fd, buf.as_mut_ptr().cast(), buf.len()) } > 0 {}
    }

    /// A waker for futures polled by the main thread: it wakes [`Signals::wait`].
    pub fn waker(&self) -> Waker {
        struct Pipe;
        impl Wake for Pipe {
            fn wake(self: Arc<Self>) {
                poke();
            }
        }
        Waker::from(Arc::new(Pipe))
    }
}

/// Makes this process the reaper of its orphaned descendants (Linux), so that the
/// command's background processes that outlive it are reaped by [`reap`] and never
/// linger as zombies in its process group.
pub fn become_subreaper() {
    #[cfg(target_os = "linux")]
    // SAFETY: prctl with an integer argument; a failure only leaves things as they were.
    unsafe {
        libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1 as libc::c_ulong);
    }
}

/// Starts `argv` in a new process group of its own (its pgid is its pid), with SIGKILL
/// as its parent-death signal, the job-control stops as quorumlock found them, and
/// `watchdog` armed with its group before it execs; `env` set (`Some`) or removed
/// (`None`) in its environment. Returns its pid.
pub fn spawn(
    argv: &[String],
    env: &[(&str, Option<String>)],
    watchdog: &Watchdog,
) -> io::Result<u32> {
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..]).process_group(0);
    for (name, value) in env {
        match value {
            Some(v) => cmd.env(name, v),
            None => cmd.env_remove(name),
        };
    }
    let parent = std::process::id() as libc::pid_t;
    let arm = watchdog.write.as_ref().map(AsRawFd::as_raw_fd);
    // SAFETY: the closure runs in the child between fork and exec and only makes
    // async-signal-safe system calls (getpid, write, sigaction, prctl, getppid) on
    // plain integers and stack data, and loads atomics.
    unsafe {
        cmd.pre_exec(move || {
            // Arm the watchdog from here, not from quorumlock after the spawn: were
            // quorumlock killed right after the exec, before it could tell the watchdog,
            // the command's children would run on. Its pipe's write end is open here
            // (close-on-exec) and 4 bytes are below PIPE_BUF: written whole.
            if let Some(fd) = arm {
                let pgid = libc::getpid().to_ne_bytes();
                libc::write(fd, pgid.as_ptr().cast(), pgid.len());
            }
            for (sig, was_default) in JOB_STOPS.into_iter().zip(&STOP_WAS_DEFAULT) {
                if was_default.load(Ordering::SeqCst) {
                    let mut sa: libc::sigaction = std::mem::zeroed();
                    sa.sa_sigaction = libc::SIG_DFL;
                    libc::sigaction(sig, &sa, std::ptr::null_mut());
                }
            }
            #[cfg(target_os = "linux")]
            {
                // The parent-death signal fires when the thread that forked exits: the
                // main thread, which lives as long as quorumlock does.
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            // quorumlock died before the prctl took effect: do not run at all.
            if libc::getppid() != parent {
                return Err(io::Error::other("quorumlock exited while starting it"));
            }
            Ok(())
        });
    }
    // std returns once the child has exec'd (or failed to): its group exists by then.
    // The `Child` is dropped without waiting: `reap` collects every child.
    Ok(cmd.spawn()?.id())
}

/// Sends `sig` to every process of group `pgid`; false if the group is empty.
pub fn signal_group(pgid: u32, sig: i32) -> bool {
    // SAFETY: killpg takes plain integers; a group of ours (pgid > 1 by construction).
    pgid > 1 && unsafe { libc::killpg(pgid as libc::pid_t, sig) } == 0
}

/// Whether any process (zombies included) is left in group `pgid`.
pub fn group_alive(pgid: u32) -> bool {
    signal_group(pgid, 0)
}

/// Reaps every child that has exited; returns each one's pid and status as a shell
/// reports it (its exit code, or 128 + the signal that killed it).
pub fn reap() -> Vec<(u32, u8)> {
    let mut done = Vec::new();
    loop {
        let mut status: libc::c_int = 0;
        // SAFETY: waitpid with a valid out pointer, WNOHANG: never blocks.
        let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
        if pid <= 0 {
            return done;
        }
        let code = if libc::WIFEXITED(status) {
            libc::WEXITSTATUS(status) as u8
        } else if libc::WIFSIGNALED(status) {
            (128 + libc::WTERMSIG(status)) as u8
        } else {
            continue;
        };
        done.push((pid as u32, code));
    }
}

/// A process forked before any thread exists that kills the command's process group
/// when quorumlock can no longer vouch for it:
///
/// - **quorumlock died** (kill -9, whatever killed it): the watchdog holds the read end
///   of a pipe whose only write end quorumlock holds; the kernel closes that end when
///   quorumlock dies, and the watchdog, seeing the end of the pipe, kills the group.
/// - **quorumlock cannot act** (stopped by SIGSTOP, frozen in a debugger, its loop
///   stalled): quorumlock keeps the moment by which the group must be gone (the
///   backstop, [`Watchdog::kill_by`]) in a page shared with the watchdog, moved with
///   every extend; the watchdog looks at it at least every [`WATCH_STEP`] and, once it
///   has passed, kills the group and says so in the same page ([`Watchdog::fired`]).
///
/// The watchdog runs in a process group of its own, so that a signal to quorumlock's
/// group (`kill -STOP %job`, a group-wide SIGKILL) does not reach it. The command writes
/// its pgid into the pipe before it execs (see [`spawn`]); quorumlock writes one byte to
/// let the watchdog go.
pub struct Watchdog {
    write: Option<OwnedFd>,
    pid: libc::pid_t,
    shared: &'static Shared,
}

/// What quorumlock and its watchdog share: one anonymous page mapped before the fork.
struct Shared {
    /// `CLOCK_MONOTONIC` nanoseconds by which the command's group must be gone, or
    /// [`NEVER`].
    kill_by: AtomicU64,
    /// Set by the watchdog when it killed the group at the backstop.
    fired: AtomicBool,
    /// `CLOCK_MONOTONIC` nanoseconds at which the watchdog noticed the command's process
    /// exit (no earlier than the exit), or 0: not seen (still running, or no pidfd).
    exited_at: AtomicU64,
}

/// The longest the watchdog sleeps between two looks at the backstop: short sleeps keep
/// the kernel's timer slack (0.1 % of a sleep, up to 100 ms) to microseconds.
const WATCH_STEP: Duration = Duration::from_millis(20);

impl Watchdog {
    /// Forks the watchdog. Must be called while the process has a single thread.
    pub fn start() -> io::Result<Watchdog> {
        let (read, write) = pipe(false)?;
        // SAFETY: an anonymous shared mapping of one page, checked below; never unmapped
        // (it lives as long as the process), so a `'static` reference to it is sound.
        // Zeroed memory is a valid `Shared` (atomics of 0); it is then set in place.
        let shared: &'static Shared = unsafe {
            let page = libc::mmap(
                std::ptr::null_mut(),
                std::mem::size_of::<Shared>(),
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            if page == libc::MAP_FAILED {
                return last_error("mmap");
            }
            &*page.cast::<Shared>()
        };
        shared.kill_by.store(NEVER, Ordering::SeqCst);
        // SAFETY: called before any thread is started (main does it first), so the
        // child is a faithful copy; the child only runs `watchdog`, which only makes
        // async-signal-safe calls and never returns.
        match unsafe { libc::fork() } {
            -1 => last_error("fork"),
            0 => watchdog(read.as_raw_fd(), write.as_raw_fd(), shared),
            pid => Ok(Watchdog {
                write: Some(write),
                pid,
                shared,
            }),
        }
    }

    /// Lets the watchdog exit without killing anything, and reaps it (it exits as soon
    /// as it reads the byte, or has already gone if `reap` collected it). Once only.
    pub fn disarm(&mut self) {
        let Some(fd) = self.write.take() else {
            return;
        };
        // SAFETY: writing one byte from a static buffer to a pipe we own.
        unsafe { libc::write(fd.as_raw_fd(), b"d".as_ptr().cast(), 1) };
        drop(fd);
        let mut status = 0;
        // SAFETY: waitpid on our own child with a valid out pointer; ECHILD (already
        // reaped) returns at once.
        unsafe { libc::waitpid(self.pid, &mut status, 0) };
    }

    /// Sets the backstop: the moment by which the command's group must be gone. Should
    /// quorumlock not have moved it by then, the watchdog kills the group itself.
    /// `None`: no backstop (the group is done). A store to shared memory: no system call
    /// that could block.
    pub fn kill_by(&self, at: Option<Instant>) {
        let at = at.map_or(NEVER, |at| {
            // The monotonic clock read first: a pause between the two readings makes
            // the moment earlier, never later.
            let base = monotonic_ns();
            let left = at.saturating_duration_since(Instant::now());
            let left = u64::try_from(left.as_nanos()).unwrap_or(NEVER);
            base.saturating_add(left).min(NEVER - 1)
        });
        self.shared.kill_by.store(at, Ordering::SeqCst);
    }

    /// Whether the watchdog killed the group at the backstop.
    pub fn fired(&self) -> bool {
        self.shared.fired.load(Ordering::SeqCst)
    }

    /// When the watchdog saw the command's process exit: no earlier than the exit
    /// itself. `None` if it has not (yet), or cannot tell (no pidfd: not Linux, a
    /// kernel before 5.3, a sandbox that refuses the call).
    pub fn exited_at(&self) -> Option<Instant> {
        let at = self.shared.exited_at.load(Ordering::SeqCst);
        if at == 0 {
            return None;
        }
        // The monotonic clock read first: a pause between the two readings makes the
        // moment later, never earlier.
        let ago = monotonic_ns().saturating_sub(at);
        Instant::now().checked_sub(Duration::from_nanos(ago))
    }
}

/// The backstop's "none".
const NEVER: u64 = u64::MAX;

/// `CLOCK_MONOTONIC` in nanoseconds: the clock `Instant` reads, shared by quorumlock and
/// its watchdog. Async-signal-safe.
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime with a valid out pointer to stack data; CLOCK_MONOTONIC
    // always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

/// The watchdog's whole life, in the forked child. Async-signal-safe calls only.
fn watchdog(read: RawFd, write: RawFd, shared: &Shared) -> ! {
    // SAFETY: every call takes plain integers or pointers to stack data, and is
    // async-signal-safe; `_exit` ends the process without running any Rust code
    // (no destructors, no atexit of the parent's copy of the runtime). `shared` is the
    // page mapped before the fork, shared with quorumlock.
    unsafe {
        libc::close(write);
        // A group of its own: a signal to quorumlock's group (a job stopped with
        // `kill -STOP %1`, a group-wide SIGKILL) must not reach the watchdog.
        libc::setpgid(0, 0);
        // A terminal's ^C, ^\, ^Z, a hang-up or a SIGTERM to quorumlock's whole group
        // must not take the watchdog down (or stop it) before quorumlock: it goes when
        // quorumlock goes, by its pipe.
        for sig in FORWARDED
            .into_iter()
            .chain([libc::SIGQUIT])
            .chain(JOB_STOPS)
        {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = libc::SIG_IGN;
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
        // Hold no terminal or pipe of the caller's open (a test reading quorumlock's
        // output to its end must not wait for the watchdog).
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
        if null >= 0 {
            for fd in 0..3 {
                libc::dup2(null, fd);
            }
            if null > 2 {
                libc::close(null);
            }
        }
        let mut pgid = [0u8; 4];
        if !read_exact(read, &mut pgid) {
            libc::_exit(0); // quorumlock ended before starting a command
        }
        let pgid = i32::from_ne_bytes(pgid);
        let step = WATCH_STEP.as_nanos() as u64;
        let mut fired = false;
        // The command's pid is its pgid. A pidfd becomes readable when it exits; -1
        // (ppoll skips a negative fd) when there is none, or once its exit is noted.
        #[cfg(target_os = "linux")]
        let exit_fd = libc::syscall(libc::SYS_pidfd_open, pgid, 0) as libc::c_int;
        #[cfg(not(target_os = "linux"))]
        let exit_fd: libc::c_int = -1;
        let mut ready = [
            libc::pollfd {
                fd: read,
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: if exit_fd >= 0 { exit_fd } else { -1 },
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        loop {
            // Sleep until the backstop or for a step, whichever is sooner (a new
            // backstop may have been set meanwhile), or until the pipe has news.
            let kill_by = shared.kill_by.load(Ordering::SeqCst);
            let now = monotonic_ns();
            if !fired && kill_by != NEVER && now >= kill_by {
                // quorumlock did not act in time: the lock's validity is running out
                // with the command still in it.
                if pgid > 1 {
                    libc::killpg(pgid, libc::SIGKILL);
                }
                shared.fired.store(true, Ordering::SeqCst);
                fired = true;
                continue;
            }
            let wait = if fired || kill_by == NEVER {
                step
            } else {
                (kill_by - now).min(step)
            };
            let timeout = libc::timespec {
                tv_sec: (wait / 1_000_000_000) as libc::time_t,
                tv_nsec: (wait % 1_000_000_000) as libc::c_long,
            };
            // ppoll, not poll: the timeout in nanoseconds, not rounded up to a millisecond.
            // An error (EINTR, or anything else) just looks again.
            ready[0].revents = 0;
            ready[1].revents = 0;
            if libc::ppoll(ready.as_mut_ptr(), 2, &timeout, std::ptr::null()) <= 0 {
                continue;
            }
            if ready[1].revents != 0 {
                // The command exited (or the pidfd failed: then nothing is noted). Either
                // way it is not watched again.
                if ready[1].revents & libc::POLLIN != 0 {
                    shared
                        .exited_at
                        .store(monotonic_ns().max(1), Ordering::SeqCst);
                }
                ready[1].fd = -1;
            }
            if ready[0].revents == 0 {
                continue;
            }
            let mut byte = [0u8; 1];
            if !read_exact(read, &mut byte) {
                break; // the end of the pipe: quorumlock is gone
            }
            if byte[0] == b'd' {
                libc::_exit(0); // let go: quorumlock finished normally
            }
        }
        if pgid > 1 {
            libc::killpg(pgid, libc::SIGKILL);
        }
        libc::_exit(0)
    }
}

/// Reads exactly `buf.len()` bytes from `fd`, retrying interrupted reads; false at the
/// end of the pipe or on an error. Async-signal-safe.
fn read_exact(fd: RawFd, buf: &mut [u8]) -> bool {
    let mut got = 0;
    while got < buf.len() {
        // SAFETY: reading into the unfilled rest of a caller's buffer.
        let n = unsafe { libc::read(fd, buf.as_mut_ptr().add(got).cast(), buf.len() - got) };
        if n > 0 {
            got += n as usize;
        // SAFETY: this thread's errno slot, always valid.
        } else if n == 0 || unsafe { *libc::__errno_location() } != libc::EINTR {
            return false;
        }
    }
    true
}
