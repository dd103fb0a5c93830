//! Restarts: a clean stop (the writer finishes, the restarted host must equal the store) and
//! a kill with commits in flight (what was durable survives, the rest is gone).

use super::*;
use crate::writer::CleanStop;

impl World {
    /// Stops the host cleanly (its writer finishes first) and starts a new one over the same
    /// store. Every connection dies with the old process; the checker verifies nothing changed.
    pub fn restart(&mut self) -> Result<(), Violation> {
        self.restart_with(false)
    }

    /// Kills the host with whatever is in flight, and starts a new one over the same store:
    /// what was durable survives, the rest is gone.
    pub fn crash(&mut self) -> Result<(), Violation> {
        self.restart_with(true)
    }

    /// A clean stop: the writer finishes everything the host handed it, and the host hears
    /// every outcome (and hands out whatever those lead to), until nothing is in flight. The
    /// host's state is then the store's; returns it, to compare the restarted host with.
    fn settle_writer(&mut self) -> Result<Option<Durable>, Violation> {
        let mut stop = CleanStop::at(self.clock.mono_ms);
        while self.writer.busy() {
            let Some(host) = self.host.as_mut() else {
                break;
            };
            let outcomes = self
                .writer
                .stop_round(&mut stop, |batch| host.store_mut().commit_group(batch))
                .map_err(|m| self.violation(m))?;
            self.report_outcomes(outcomes)?;
        }
        self.writer.crash();
        let pool = self.options.session_ids();
        Ok(self.host.as_ref().map(|h| Durable::capture(h, &pool)))
    }

    pub(super) fn restart_with(&mut self, kill: bool) -> Result<(), Violation> {
        if self.host.is_none() {
            return Ok(());
        }
        let pool = self.options.session_ids();
        let before = if kill {
            self.writer.crash();
            None
        } else {
            self.settle_writer()?
        };
        let Some(host) = self.host.take() else {
            return Ok(());
        };
        self.counters.client_ids_released += host.stats().client_ids_released;
        let store = host.into_store();
        self.store_faults_before += store.refused;
        let mut reconnect = Vec::new();
        self.unread.clear();
        for (conn, link) in self.net.drop_all() {
            let c = &mut self.clients[link.client];
            if c.connection.as_ref().is_some_and(|x| x.conn == conn) {
                c.disconnected();
                reconnect.push(link.client);
            }
        }
        self.checker.restarted();
        self.counters.restarts += 1;
        // The next host numbers its requests from 1 again.
        self.gossip.host_ids.clear();
        let host_seed: u64 = self.rng.random();
        let mut store = store;
        store.refused = 0;
        let host = Host::new(self.config.clone(), store, host_seed)
            .map_err(|e| self.violation(format!("host failed to restart over its store: {e}")))?;
        self.epoch += 1;
        let result = self.checker.after_restart(before.as_ref(), &host, &pool);
        self.host = Some(host);
        result.map_err(|m| self.violation(m))?;
        if self.options.autonomous || self.liveness {
            for i in reconnect {
                self.schedule_reconnect(i);
            }
        }
        Ok(())
    }
}
