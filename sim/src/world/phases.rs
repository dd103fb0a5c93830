//! The world's two phases and what tests drive it with: the safety phase, the liveness phase
//! (heal, settle, converge) and the helpers named scenarios use to steer a run by hand.

use super::*;

impl World {
    /// The safety phase: `options.steps_max` steps with every fault on.
    pub fn run_safety(&mut self) -> Result<(), Violation> {
        for _ in 0..self.options.steps_max {
            if !self.step()? {
                break;
            }
        }
        Ok(())
    }

    /// Clients that must converge in the liveness phase: as many as the host admits at once.
    pub(super) fn liveness_clients(&self) -> usize {
        self.clients
            .len()
            .min(self.options.limits.connections_max as usize)
    }

    /// The liveness phase: heal everything, then require every client that can be connected
    /// to be initialized with nothing owed and nothing in flight, and to agree with the host.
    pub fn settle(&mut self) -> Result<(), Violation> {
        self.liveness = true;
        self.net.heal();
        self.writer.heal();
        if let Some(h) = &self.host {
            h.store().disarm();
        }
        let keep = self.liveness_clients();
        for i in 0..self.clients.len() {
            self.clients[i].calm = true;
            if i >= keep {
                self.disconnect(i, false);
                continue;
            }
            match &self.clients[i].connection {
                None => self.schedule(self.clock.mono_ms + 1, Event::Connect(i)),
                Some(c) if !c.ready && !c.handshake_pending => {
                    self.clients[i].handshake();
                    self.send_outbox(i);
                }
                Some(_) => {}
            }
        }
        self.converge()?;
        // A barrier: every client pings and waits for the answer (and everything before it).
        for i in 0..keep {
            self.clients[i].request(
                "ping",
                serde_json::json!({ "channel": crate::client::ROOT }),
                crate::client::Request::Ping,
            );
            self.send_outbox(i);
        }
        self.converge()?;
        let Some(host) = self.host.as_ref() else {
            return Err(self.violation("no host"));
        };
        let result = self.checker.final_check(host, &self.net, &self.clients);
        result.map_err(|m| self.violation(format!("liveness: {m}")))?;
        // The registration table holds exactly what the connected clients registered.
        let owned: usize = self
            .clients
            .iter()
            .filter_map(|c| c.connection.as_ref())
            .map(|c| c.services.len())
            .sum();
        let held = self.host.as_ref().map_or(0, Host::service_count);
        if held != owned {
            return Err(self.violation(format!(
                "liveness: the host holds {held} services, connected clients registered {owned}"
            )));
        }
        // Every call was answered, so nothing is pending host-side.
        let pending = self.host.as_ref().map_or(0, Host::pending_requests);
        if pending != 0 {
            return Err(self.violation(format!(
                "liveness: every call was answered, the host still has {pending} pending"
            )));
        }
        Ok(())
    }

    /// After settling: every client leaves for good. Every table must drain: no connection
    /// and no service left on the host.
    pub fn depart(&mut self) -> Result<(), Violation> {
        self.departed = true;
        for i in 0..self.clients.len() {
            self.disconnect(i, false);
        }
        let steps_max = self.steps + SETTLE_STEPS_MAX;
        while !self.net.is_idle()
            || !self.unread.is_empty()
            || self.writer.busy()
            || self
                .agenda
                .values()
                .any(|e| matches!(e, Event::Flushed { .. }))
        {
            if self.steps > steps_max || !self.step()? {
                return Err(self.violation("departure: the network never drained"));
            }
        }
        let Some(host) = self.host.as_ref() else {
            return Ok(());
        };
        let (conns, services) = (host.connection_count(), host.service_count());
        let pending = host.pending_requests();
        if conns != 0 || services != 0 || pending != 0 || self.checker.services.pending() != 0 {
            return Err(self.violation(format!(
                "departure: every client left, the host still holds {conns} connections, {services} services and {pending} pending requests (model: {})",
                self.checker.services.pending()
            )));
        }
        Ok(())
    }

    fn converge(&mut self) -> Result<(), Violation> {
        // A relayed request may rightly stay pending until its deadline (the checker requires
        // that it ends exactly then), which may be as far as the longest timeout allowed.
        let deadline_ms =
            self.clock.mono_ms + SETTLE_BUDGET_MS + self.options.limits.relay_timeout_ms_max;
        let steps_max = self.steps + SETTLE_STEPS_MAX;
        while let Some(reason) = self.pending() {
            if self.clock.mono_ms > deadline_ms || self.steps > steps_max {
                return Err(self.violation(format!("liveness: did not converge: {reason}")));
            }
            if !self.step()? {
                return Err(self.violation(format!("liveness: nothing left to run, but {reason}")));
            }
        }
        Ok(())
    }

    /// Why the world has not converged yet, or `None`.
    pub fn pending(&self) -> Option<String> {
        let keep = self.liveness_clients();
        for c in &self.clients[..keep] {
            match &c.connection {
                None => return Some(format!("client {} is offline", c.index)),
                Some(x) if !x.ready => {
                    return Some(format!("client {} has not finished its handshake", c.index))
                }
                Some(_) => {}
            }
            if let Some(what) = c.awaiting() {
                return Some(format!("client {} awaits {what}", c.index));
            }
        }
        if let Some(c) = self.clients[keep..].iter().find(|c| c.connection.is_some()) {
            return Some(format!("client {} should be offline", c.index));
        }
        if !self.net.is_idle() {
            return Some("frames in flight".into());
        }
        if !self.unread.is_empty() {
            return Some("input unread while the host takes none".into());
        }
        if self.writer.busy() {
            return Some("commits in flight".into());
        }
        if self
            .agenda
            .values()
            .any(|e| matches!(e, Event::Flushed { .. }))
        {
            return Some("flush reports pending".into());
        }
        None
    }

    /// Runs until nothing is pending or `budget_ms` passes (scripted tests).
    pub fn run_until_quiet(&mut self, budget_ms: u64) -> Result<(), Violation> {
        let deadline_ms = self.clock.mono_ms + budget_ms;
        while self.quiet().is_some() {
            if self.clock.mono_ms > deadline_ms || !self.step()? {
                break;
            }
        }
        Ok(())
    }

    /// Like [`World::pending`] but only about the network and outstanding requests.
    fn quiet(&self) -> Option<String> {
        if !self.net.is_idle() || !self.unread.is_empty() {
            return Some("frames in flight".into());
        }
        if self.writer.busy() {
            return Some("commits in flight".into());
        }
        if self.agenda.values().any(|e| {
            matches!(
                e,
                Event::Flushed { .. } | Event::Connect(_) | Event::Handshake { .. }
            )
        }) {
            return Some("agenda".into());
        }
        self.clients.iter().find_map(|c| c.awaiting())
    }

    /// Runs the clock forward by `ms`, stepping everything due (scripted tests).
    pub fn advance(&mut self, ms: u64) -> Result<(), Violation> {
        let until = self.clock.mono_ms + ms;
        while let Some((at, _)) = self.next_due() {
            if at > until {
                break;
            }
            self.step()?;
        }
        self.clock.advance_to(until);
        Ok(())
    }

    /// Sends whatever client `i` queued (after a scripted test called a client method).
    pub fn flush_client(&mut self, i: usize) {
        self.send_outbox(i);
    }

    /// Lets a scripted test drive client `i`, then sends what it queued.
    pub fn with_client<T>(&mut self, i: usize, f: impl FnOnce(&mut SimClient) -> T) -> T {
        let out = f(&mut self.clients[i]);
        self.send_outbox(i);
        out
    }

    /// Steps the wall clock by `ms` (negative: backwards), as an NTP step would.
    pub fn jump_wall_clock(&mut self, ms: i64) {
        self.clock.wall_offset_ms += ms;
    }

    /// Makes client `i` stop reading for `ms`.
    pub fn clog(&mut self, i: usize, ms: u64) {
        if let Some(conn) = self.clients[i].connection.as_ref().map(|c| c.conn) {
            self.net.clog(conn, self.clock.mono_ms + ms);
        }
    }

    /// The run's report.
    pub fn report(&self) -> Report {
        let store_faults =
            self.store_faults_before + self.host.as_ref().map_or(0, |h| h.store().refused);
        let sum = |f: fn(&SimClient) -> u64| self.clients.iter().map(f).sum::<u64>();
        Report {
            seed: self.options.seed,
            digest: self.checker.digest(),
            steps: self.steps,
            sim_ms: self.clock.mono_ms,
            outputs: self.checker.outputs,
            server_seq: self.host.as_ref().map_or(0, Host::server_seq),
            comparisons: self.checker.comparisons,
            counters: Counters {
                client_ids_released: self.counters.client_ids_released
                    + self
                        .host
                        .as_ref()
                        .map_or(0, |h| h.stats().client_ids_released),
                ..self.counters.clone()
            },
            reconnects: (
                sum(|c| c.stats.replays),
                sum(|c| c.stats.snapshots),
                sum(|c| c.stats.reconnect_errors),
            ),
            echoes: (sum(|c| c.stats.rejections), sum(|c| c.stats.accepted)),
            store_faults,
            commits: self.writer.stats.clone(),
            durability: self.checker.durability.stats.clone(),
            chat_limit_rejections: sum(|c| c.stats.chat_limit_rejections),
            services: self.checker.services.tally.clone(),
        }
    }
}
