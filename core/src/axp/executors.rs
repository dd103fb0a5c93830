//! The executor registry, `axp-executors://`: contributor-owned executors, who owns each, and
//! whether it is online.
//!
//! An entry is stored as its own record (`Table::Executor`, one small write per change, never
//! the whole registry) and announced with `_axp/executorChanged` on the registry channel.
//! Entries are never deleted: an executor whose registration or lease renewal lapsed goes
//! offline, by a core timer ([`Timer::Executor`]), and a restarted host marks every one
//! offline (it cannot vouch for any). Ownership is for good: another principal can never
//! re-register an executor id, so a stale id never routes to someone else's executor.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::ahp::tx::axp_envelope;
use crate::axp::params::RegisterParams;
use crate::axp::reducer::{reduce_executors, AxpAction};
use crate::axp::state::{registry_json, ExecutorInfo};
use crate::axp::{commit_and_broadcast, contribute, json_text, Done, Op};
use crate::channel::EXECUTORS;
use crate::error::RpcError;
use crate::kernel::time::Timer;
use crate::kernel::Kernel;
use crate::log::change::{Event, Record, StoredRecord, Table};
use crate::log::store::Store;
use crate::log::write_path::{Touched, Txn};
use crate::principal::Principal;

/// How long a timer that found the write path full waits before trying again.
pub(crate) const TIMER_RETRY_MS: u64 = 100;

/// The registry. See the module docs.
#[derive(Default)]
pub(crate) struct Executors {
    entries: BTreeMap<String, ExecutorInfo>,
}

/// The monotonic instant at which wall-clock time `at_ms` comes, as the host sees time now.
pub(crate) fn deadline<S: Store>(k: &Kernel<S>, at_ms: u64) -> crate::kernel::time::Instant {
    k.now().mono.plus_ms(at_ms.saturating_sub(k.wall_ms()))
}

impl Executors {
    /// The entries the store holds; `Err(key)` names one that cannot be read.
    pub(crate) fn load(records: &[StoredRecord]) -> Result<Executors, String> {
        let mut entries = BTreeMap::new();
        for r in records.iter().filter(|r| r.table == Table::Executor) {
            let info: ExecutorInfo = serde_json::from_slice(&r.value).map_err(|_| r.key.clone())?;
            entries.insert(info.id.clone(), info);
        }
        Ok(Executors { entries })
    }

    pub(crate) fn get(&self, id: &str) -> Option<&ExecutorInfo> {
        self.entries.get(id)
    }

    /// The state of `axp-executors://`.
    pub(crate) fn json(&self) -> Value {
        registry_json(self.entries.values())
    }

    /// Applies a change the host issued (the registry's reducer, as clients apply it).
    pub(crate) fn apply(&mut self, action: &AxpAction) {
        reduce_executors(&mut self.entries, action);
    }

    /// The record that stores `info`.
    pub(crate) fn record(info: &ExecutorInfo) -> Record {
        Record::json(Table::Executor, info.id.clone(), &json_text(info))
    }

    /// Rebuilds entry `id` as the store and the changes in flight have it, after a failure.
    pub(crate) fn rebuild<S: Store>(&mut self, k: &mut Kernel<S>, id: &str) {
        let stored = k
            .view()
            .record(Table::Executor, id)
            .unwrap_or_else(|e| panic!("executor {id} cannot be rebuilt: {e}"));
        match stored.and_then(|v| serde_json::from_slice::<ExecutorInfo>(&v).ok()) {
            Some(info) => {
                if info.online {
                    k.arm(Timer::Executor(id.to_owned()), deadline(k, info.expires_at));
                }
                self.entries.insert(id.to_owned(), info);
            }
            None => {
                self.entries.remove(id);
            }
        }
    }

    /// `_axp/register`: adds or refreshes one of the caller's executors.
    pub(crate) fn register<S: Store>(
        &mut self,
        k: &mut Kernel<S>,
        principal: &Principal,
        p: RegisterParams,
        op: &Op,
    ) -> Result<Done, RpcError> {
        contribute(principal)?;
        match self.entries.get(&p.executor_id) {
            Some(prior) if prior.owner != principal.id => {
                return Err(RpcError::forbidden(
                    "Executor identity belongs to another contributor",
                ))
            }
            Some(_) => {}
            None if self.entries.len() >= k.limits().executors_max as usize => {
                return Err(RpcError::limit("Executor limit reached"))
            }
            None => {}
        }
        let info = ExecutorInfo {
            id: p.executor_id,
            owner: principal.id.clone(),
            name: p.name,
            placement: p.placement,
            capabilities: p.capabilities,
            expires_at: k.wall_ms().saturating_add(p.ttl_ms),
            online: true,
        };
        let result = json_text(&info);
        let mut txn = self.change(k, vec![info]);
        txn.receipts.push(op.receipt(&result));
        let change = commit_and_broadcast(k, txn);
        Ok(Done { change, result })
    }

    /// A change writing `infos` (and announcing each), numbered from the host's current
    /// `serverSeq`, applied to the registry at once and each online one's timer armed. The
    /// caller commits it before building anything else.
    pub(crate) fn change<S: Store>(&mut self, k: &mut Kernel<S>, infos: Vec<ExecutorInfo>) -> Txn {
        let mut txn = Txn::default();
        let base = k.server_seq();
        for (i, info) in infos.into_iter().enumerate() {
            let action = AxpAction::ExecutorChanged {
                executor: info.clone(),
            };
            let seq = base + i as u64 + 1;
            txn.events.push(Event {
                seq,
                channel: EXECUTORS.into(),
                envelope: axp_envelope(EXECUTORS, &action, seq).into(),
            });
            txn.records.push(Self::record(&info));
            txn.touched.push(Touched::Executor(info.id.clone()));
            self.note(k, &info);
            self.apply(&action);
        }
        txn
    }

    /// Arms (or disarms) the timer that takes `info` offline.
    pub(crate) fn note<S: Store>(&self, k: &mut Kernel<S>, info: &ExecutorInfo) {
        let timer = Timer::Executor(info.id.clone());
        if info.online {
            let at = deadline(k, info.expires_at);
            k.arm(timer, at);
        } else {
            k.disarm(&timer);
        }
    }

    /// `Timer::Executor(id)`: takes it offline if its time is up (a renewal may have moved it).
    pub(crate) fn on_timer<S: Store>(&mut self, k: &mut Kernel<S>, id: &str) {
        let Some(info) = self.entries.get(id) else {
            return;
        };
        if !info.online {
            return;
        }
        if info.expires_at > k.wall_ms() {
            let at = deadline(k, info.expires_at);
            return k.arm(Timer::Executor(id.to_owned()), at);
        }
        if k.room().is_err() {
            let at = k.now().mono.plus_ms(TIMER_RETRY_MS);
            return k.arm(Timer::Executor(id.to_owned()), at);
        }
        let mut offline = info.clone();
        offline.online = false;
        let txn = self.change(k, vec![offline]);
        commit_and_broadcast(k, txn);
    }

    /// Every online entry, taken offline (a restarted host cannot vouch for any).
    pub(crate) fn all_offline(&self) -> Vec<ExecutorInfo> {
        self.entries
            .values()
            .filter(|e| e.online)
            .map(|e| ExecutorInfo {
                online: false,
                ..e.clone()
            })
            .collect()
    }
}
