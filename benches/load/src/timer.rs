//! A wake-up timer finer than epoll's millisecond (Linux `timerfd`), registered in the same
//! `Poll` as the connections, so a sleeping tool wakes for whichever comes first: the next
//! message due or a socket event.
//!
//! Why: `epoll_wait` takes whole milliseconds, so a tool that sleeps between sends can only
//! send in bursts of a millisecond's worth of messages (100 at 100k/s). A burst that size is
//! itself a load pattern: at 64->64 the server works through ~100 one-message writes in a row,
//! and the last of them waits for the rest. With this timer the burst is the rate times
//! `--sleep-min`, down to a few messages.

use std::io;
use std::time::Duration;

use mio::{Registry, Token};

pub struct Timer {
    imp: imp::Timer,
}

impl Timer {
    /// A disarmed timer registered under `token`; `None` where there is no such timer (not
    /// Linux), in which case the caller sleeps in epoll's milliseconds.
    pub fn new(registry: &Registry, token: Token) -> io::Result<Option<Timer>> {
        Ok(imp::Timer::new(registry, token)?.map(|imp| Timer { imp }))
    }

    /// Fires once after `after` (re-arming replaces any earlier expiry and clears a pending one).
    pub fn arm(&self, after: Duration) -> io::Result<()> {
        self.imp.arm(after.max(Duration::from_nanos(1)))
    }
}

#[cfg(target_os = "linux")]
mod imp {
    use std::io;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::time::Duration;

    use mio::unix::SourceFd;
    use mio::{Interest, Registry, Token};

    pub struct Timer {
        fd: OwnedFd,
    }

    impl Timer {
        pub fn new(registry: &Registry, token: Token) -> io::Result<Option<Timer>> {
            // SAFETY: plain syscall; the descriptor it returns is owned below.
            let fd = unsafe {
                libc::timerfd_create(
                    libc::CLOCK_MONOTONIC,
                    libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
                )
            };
            if fd < 0 {
                return Err(io::Error::last_os_error());
            }
            // SAFETY: `fd` is a fresh descriptor nothing else owns.
            let fd = unsafe { OwnedFd::from_raw_fd(fd) };
            registry.register(&mut SourceFd(&fd.as_raw_fd()), token, Interest::READABLE)?;
            Ok(Some(Timer { fd }))
        }

        pub fn arm(&self, after: Duration) -> io::Result<()> {
            let spec = libc::itimerspec {
                it_interval: libc::timespec {
                    tv_sec: 0,
                    tv_nsec: 0,
                },
                it_value: libc::timespec {
                    tv_sec: after.as_secs() as libc::time_t,
                    tv_nsec: after.subsec_nanos() as libc::c_long,
                },
            };
            // SAFETY: a descriptor we own, a valid itimerspec, and no old value wanted.
            let rc = unsafe {
                libc::timerfd_settime(self.fd.as_raw_fd(), 0, &spec, std::ptr::null_mut())
            };
            if rc == 0 {
                Ok(())
            } else {
                Err(io::Error::last_os_error())
            }
        }
    }
}

#[cfg(not(target_os = "linux"))]
mod imp {
    use std::io;
    use std::time::Duration;

    use mio::{Registry, Token};

    pub struct Timer;

    impl Timer {
        pub fn new(_: &Registry, _: Token) -> io::Result<Option<Timer>> {
            Ok(None)
        }

        pub fn arm(&self, _: Duration) -> io::Result<()> {
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mio::{Events, Poll};
    use std::time::Instant;

    /// Armed for 300 µs, the timer ends a poll that would otherwise sleep 50 ms, and not before
    /// its time.
    #[test]
    fn a_timer_wakes_the_poll_between_milliseconds() {
        let mut poll = Poll::new().expect("poll");
        let Some(timer) = Timer::new(poll.registry(), Token(7)).expect("timerfd") else {
            return; // not Linux
        };
        let mut events = Events::with_capacity(8);
        let start = Instant::now();
        timer.arm(Duration::from_micros(300)).expect("arm");
        poll.poll(&mut events, Some(Duration::from_millis(50)))
            .expect("poll");
        let took = start.elapsed();
        assert!(
            events.iter().any(|e| e.token() == Token(7)),
            "no timer event"
        );
        assert!(
            took >= Duration::from_micros(300) && took < Duration::from_millis(40),
            "woke after {took:?}"
        );
    }
}
