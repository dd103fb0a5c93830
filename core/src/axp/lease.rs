//! Grants and leases: who may run a session's turns, for how long, on whose budget.
//!
//! A lease lasts 3–300 s and is renewed every third of that (`heartbeatMs`); output is not a
//! heartbeat, so a quiet compile stays live. Every claim advances the session's epoch, and
//! every executor mutation is fenced on owner, epoch, expiry and grant, so an executor that
//! lost its lease can change nothing. Expiry comes from a core timer ([`Timer::Lease`]); a
//! restarted host orphans every lease at once, keeping the epoch so the same executor can
//! reclaim with `resumeEpoch`.

use crate::ahp::sessions::Sessions;
use crate::ahp::tx::Tx;
use crate::axp::budget::within;
use crate::axp::executors::{deadline, Executors, TIMER_RETRY_MS};
use crate::axp::params::{ClaimParams, FencedParams, GrantParams, Outcome, RevokeParams};
use crate::axp::reducer::AxpAction;
use crate::axp::state::{Allowance, ExchangeState, ExecutorInfo, Grant, Lease, Status};
use crate::axp::{contribute, json_text, session_of};
use crate::error::{RpcError, BUDGET, STALE};
use crate::kernel::time::Timer;
use crate::kernel::Kernel;
use crate::log::store::Store;
use crate::log::write_path::{Touched, Txn};
use crate::principal::Principal;

/// Why a lease ended without its executor finishing its turn (the turn's error message).
pub(crate) const EXPIRED: &str = "Executor lease expired";
pub(crate) const UNDOCKED: &str = "Executor undocked";
pub(crate) const REVOKED: &str = "Donation revoked";
pub(crate) const RESTARTED: &str = "Host restarted; reclaim to resume";
pub(crate) const DISCONNECTED: &str = "Executor disconnected; interrupted work was not replayed";

/// Takes session `channel` out of the table for a change, or `-32008`.
pub(crate) fn begin<S: Store>(
    k: &Kernel<S>,
    sessions: &mut Sessions,
    channel: &str,
) -> Result<Tx, RpcError> {
    let id = session_of(channel)?;
    sessions
        .begin(k, id)
        .ok_or_else(|| RpcError::not_found("Unknown channel"))
}

/// Arms (or disarms) the timer that ends session `id`'s lease.
pub(crate) fn note<S: Store>(k: &mut Kernel<S>, id: &str, exchange: &ExchangeState) {
    let timer = Timer::Lease(id.to_owned());
    match &exchange.lease {
        Some(lease) => {
            let at = deadline(k, lease.expires_at);
            k.arm(timer, at)
        }
        None => k.disarm(&timer),
    }
}

/// The caller's live lease at `epoch`, for an executor mutation: `-32040` when it is not the
/// caller's, not at that epoch, expired or the session is not open, `-32041` when its grant is
/// revoked. A grant revoked by an overspend keeps its lease (only a donor's revocation orphans
/// it), and the budget answer comes before the stale one: the executor learns that it must
/// stop, not that it should reclaim.
pub(crate) fn fenced<'a>(
    principal: &Principal,
    exchange: &'a ExchangeState,
    epoch: u64,
    now_ms: u64,
) -> Result<&'a Lease, RpcError> {
    contribute(principal)?;
    let mine = exchange
        .lease
        .as_ref()
        .filter(|l| l.owner == principal.id && l.epoch == epoch);
    if let Some(lease) = mine {
        if exchange
            .grants
            .get(&lease.grant_id)
            .is_some_and(|g| g.revoked)
        {
            return Err(RpcError::new(BUDGET, "Donation revoked"));
        }
    }
    match mine {
        Some(lease) if lease.expires_at > now_ms && exchange.status == Status::Open => Ok(lease),
        _ => Err(RpcError::new(
            STALE,
            "Executor lease is stale or belongs to another principal",
        )),
    }
}

/// Ends the lease: the running turn ends in error (its reservation charged in full) and the
/// session is orphaned at the same epoch.
pub(crate) fn orphan<S: Store>(
    k: &mut Kernel<S>,
    tx: &mut Tx,
    reason: &str,
) -> Result<(), RpcError> {
    if crate::axp::turn::finish(k, tx, None, Outcome::Error, reason)? {
        crate::axp::turn::sync_chat(tx)?;
    }
    let epoch = tx.entry.exchange.epoch;
    tx.emit_axp(AxpAction::LeaseChanged {
        lease: None,
        epoch,
        status: Status::Orphaned,
    });
    Ok(())
}

/// `_axp/grant`: a contributor donates (or changes) a budget on this session.
pub(crate) fn grant<S: Store>(
    k: &mut Kernel<S>,
    tx: &mut Tx,
    principal: &Principal,
    p: GrantParams,
) -> Result<String, RpcError> {
    contribute(principal)?;
    let ex = &tx.entry.exchange;
    let old = ex.grants.get(&p.grant_id);
    if old.is_some_and(|g| g.owner != principal.id) {
        return Err(RpcError::forbidden("Only the donor can change this grant"));
    }
    if old.is_none() && ex.grants.len() >= k.limits().grants_per_session_max as usize {
        return Err(RpcError::limit("Grant limit reached for this session"));
    }
    let spent = old.map_or(Allowance::default(), |g| g.spent);
    if !within(&spent, &p.limit) {
        return Err(RpcError::new(
            BUDGET,
            "The new limit is lower than what has already been spent",
        ));
    }
    if ex
        .reservation
        .as_ref()
        .is_some_and(|r| r.grant_id == p.grant_id)
    {
        return Err(RpcError::conflict(
            "You can't change the budget while a turn is running. Revoke it to stop the agent.",
        ));
    }
    // Granting again clears `revoked`: an explicit act of the donor (satellites never
    // re-grant an existing grant).
    let grant = Grant {
        id: p.grant_id,
        owner: principal.id.clone(),
        limit: p.limit,
        spent,
        revoked: false,
        enforcement: p.enforcement,
    };
    let result = json_text(&grant);
    tx.emit_axp(AxpAction::GrantChanged { grant });
    Ok(result)
}

/// `_axp/revoke`: the donor withdraws a grant; a lease spending it ends at once.
pub(crate) fn revoke<S: Store>(
    k: &mut Kernel<S>,
    tx: &mut Tx,
    principal: &Principal,
    p: RevokeParams,
) -> Result<String, RpcError> {
    let ex = &tx.entry.exchange;
    let Some(grant) = ex
        .grants
        .get(&p.grant_id)
        .filter(|g| g.owner == principal.id)
    else {
        return Err(RpcError::forbidden("Only the donor can revoke this grant"));
    };
    let mut grant = grant.clone();
    grant.revoked = true;
    let leased = ex.lease.as_ref().is_some_and(|l| l.grant_id == p.grant_id);
    tx.emit_axp(AxpAction::GrantChanged { grant });
    if leased {
        orphan(k, tx, REVOKED)?;
    }
    Ok("null".into())
}

/// `_axp/claim`: an executor takes the session, at the next epoch.
pub(crate) fn claim<S: Store>(
    k: &mut Kernel<S>,
    tx: &mut Tx,
    executors: &Executors,
    principal: &Principal,
    p: ClaimParams,
) -> Result<String, RpcError> {
    contribute(principal)?;
    let now = k.wall_ms();
    if tx.entry.exchange.status == Status::Closed {
        return Err(RpcError::conflict("Session is closed"));
    }
    if let Some(resume) = p.resume_epoch {
        // Resuming after a disconnect: nobody may have claimed in between. An intervening
        // owner advanced the epoch, so it is seen even if it has released since.
        let ex = &tx.entry.exchange;
        let same = ex.epoch == resume
            && ex.lease.as_ref().is_none_or(|l| {
                l.owner == principal.id
                    && l.executor_id == p.executor_id
                    && l.grant_id == p.grant_id
            });
        if !same {
            return Err(RpcError::new(
                STALE,
                "Session ownership changed while disconnected; park again to join its current state",
            ));
        }
        if ex.lease.is_some() {
            orphan(k, tx, DISCONNECTED)?;
        }
    }
    if tx
        .entry
        .exchange
        .lease
        .as_ref()
        .is_some_and(|l| l.expires_at <= now)
    {
        orphan(k, tx, EXPIRED)?;
    }
    let ex = &tx.entry.exchange;
    if ex.lease.is_some() {
        return Err(RpcError::conflict("Session already has an executor"));
    }
    if executors
        .get(&p.executor_id)
        .is_some_and(|e| e.owner != principal.id)
    {
        return Err(RpcError::forbidden(
            "Executor identity belongs to another contributor",
        ));
    }
    let usable = ex
        .grants
        .get(&p.grant_id)
        .is_some_and(|g| g.owner == principal.id && !g.revoked);
    if !usable {
        return Err(RpcError::forbidden(
            "You need an active budget grant on this session first",
        ));
    }
    let epoch = ex.epoch + 1;
    let lease = Lease {
        owner: principal.id.clone(),
        executor_id: p.executor_id,
        epoch,
        expires_at: now.saturating_add(p.lease_ms),
        heartbeat_ms: p.lease_ms / 3,
        grant_id: p.grant_id,
    };
    let result = json_text(&lease);
    tx.emit_axp(AxpAction::LeaseChanged {
        lease: Some(lease),
        epoch,
        status: Status::Open,
    });
    Ok(result)
}

/// `_axp/renew`: the heartbeat. Returns the result and the registry entry it refreshed (the
/// caller applies it once the change is issued).
pub(crate) fn renew<S: Store>(
    k: &mut Kernel<S>,
    tx: &mut Tx,
    extra: &mut Txn,
    executors: &Executors,
    principal: &Principal,
    p: FencedParams,
) -> Result<(String, Option<ExecutorInfo>), RpcError> {
    let now = k.wall_ms();
    let mut lease = fenced(principal, &tx.entry.exchange, p.epoch, now)?.clone();
    lease.expires_at = now.saturating_add(lease.heartbeat_ms * 3);
    let refreshed = executors.get(&lease.executor_id).map(|e| ExecutorInfo {
        online: true,
        expires_at: lease.expires_at,
        ..e.clone()
    });
    if let Some(info) = &refreshed {
        tx.emit_elsewhere(
            crate::channel::EXECUTORS,
            &AxpAction::ExecutorChanged {
                executor: info.clone(),
            },
        );
        extra.records.push(Executors::record(info));
        extra.touched.push(Touched::Executor(info.id.clone()));
    }
    let result = json_text(&lease);
    tx.emit_axp(AxpAction::LeaseChanged {
        lease: Some(lease),
        epoch: p.epoch,
        status: Status::Open,
    });
    Ok((result, refreshed))
}

/// `_axp/release`: the executor leaves; its running turn ends in error.
pub(crate) fn release<S: Store>(
    k: &mut Kernel<S>,
    tx: &mut Tx,
    principal: &Principal,
    p: FencedParams,
) -> Result<String, RpcError> {
    fenced(principal, &tx.entry.exchange, p.epoch, k.wall_ms())?;
    orphan(k, tx, UNDOCKED)?;
    Ok("null".into())
}

/// `Timer::Lease(id)`: orphans the session if its lease has expired (a renewal may have
/// moved the deadline; a wall clock that stepped back delays it).
pub(crate) fn on_timer<S: Store>(k: &mut Kernel<S>, sessions: &mut Sessions, id: &str) {
    let Some(expires_at) = sessions
        .get(id)
        .and_then(|e| e.exchange.lease.as_ref())
        .map(|l| l.expires_at)
    else {
        return;
    };
    if expires_at > k.wall_ms() {
        let at = deadline(k, expires_at);
        return k.arm(Timer::Lease(id.to_owned()), at);
    }
    if k.room().is_err() {
        let at = k.now().mono.plus_ms(TIMER_RETRY_MS);
        return k.arm(Timer::Lease(id.to_owned()), at);
    }
    let Some(mut tx) = sessions.begin(k, id) else {
        return;
    };
    match orphan(k, &mut tx, EXPIRED) {
        Ok(()) => {
            sessions.commit_tx(k, tx, Txn::default());
        }
        Err(e) => {
            // Settling a reservation in full cannot overflow (reserving checked it), so this
            // is not expected; the session stays as it was and the next claim retries.
            tracing::warn!(
                session = id,
                code = e.code,
                "lease expiry could not be applied"
            );
            sessions.abort_tx(k, tx);
        }
    }
}

/// Host start: every online executor goes offline and every lease is orphaned (reservations
/// settled in full, epochs kept), as one change. A new process cannot vouch for any work in
/// flight before it; executors reclaim with `resumeEpoch`. Nothing is issued when there is
/// nothing to end.
pub(crate) fn on_start<S: Store>(
    k: &mut Kernel<S>,
    sessions: &mut Sessions,
    executors: &mut Executors,
) {
    let offline = executors.all_offline();
    let leased: Vec<String> = sessions
        .values()
        .filter(|e| e.exchange.lease.is_some())
        .map(|e| e.id.clone())
        .collect();
    if offline.is_empty() && leased.is_empty() {
        return;
    }
    let head = executors.change(k, offline);
    let mut next = k.server_seq() + head.events.len() as u64;
    let mut txs = Vec::new();
    for id in leased {
        let Some(mut tx) = sessions.begin_at(id.as_str(), next) else {
            continue;
        };
        if let Err(e) = orphan(k, &mut tx, RESTARTED) {
            tracing::warn!(session = %id, code = e.code, "a lease could not be ended at start");
            sessions.abort_tx(k, tx);
            continue;
        }
        next = tx.next_seq() - 1;
        txs.push(tx);
    }
    sessions.commit_many(k, head, txs);
}
