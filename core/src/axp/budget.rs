//! Budget arithmetic: integer tokens, USD micros and turns, every sum checked.
//!
//! A grant's `spent` only ever grows. A turn is reserved against `limit - spent` before it
//! produces output and settled exactly once: with the usage its executor reports, or with the
//! full reservation when nothing is reported (lease expiry, release, revocation, restart,
//! cancellation, steering, close). A truthful report above the limit is recorded, not refused
//! or capped, and revokes the grant: hiding the debt would let an executor try again with
//! smaller numbers.

use crate::axp::params::COUNT_MAX;
use crate::axp::state::{Allowance, Grant, Reservation, Source, Usage};
use crate::error::{RpcError, BUDGET};

/// `a + b`, each component a safe integer (`-32041` otherwise, as the reference's
/// `Number.isSafeInteger` check).
pub(crate) fn add(a: Allowance, b: Allowance) -> Result<Allowance, RpcError> {
    let sum = |x: u64, y: u64| x.checked_add(y).filter(|s| *s <= COUNT_MAX);
    match (
        sum(a.tokens, b.tokens),
        sum(a.cost_micros, b.cost_micros),
        sum(a.turns, b.turns),
    ) {
        (Some(tokens), Some(cost_micros), Some(turns)) => Ok(Allowance {
            tokens,
            cost_micros,
            turns,
        }),
        _ => Err(RpcError::new(BUDGET, "Allowance overflow")),
    }
}

/// Whether every component of `value` is within `limit`.
pub(crate) fn within(value: &Allowance, limit: &Allowance) -> bool {
    value.tokens <= limit.tokens
        && value.cost_micros <= limit.cost_micros
        && value.turns <= limit.turns
}

/// Checks that `grant` can reserve `ceiling`: exactly one turn, some tokens, within what is
/// left. Reserving changes nothing in the grant; settling does.
pub(crate) fn reserve(grant: &Grant, ceiling: &Allowance) -> Result<(), RpcError> {
    if grant.revoked {
        return Err(RpcError::new(BUDGET, "Donation revoked"));
    }
    if ceiling.turns != 1 || ceiling.tokens == 0 {
        return Err(RpcError::invalid_params(
            "Reserve exactly one turn and a positive token ceiling",
        ));
    }
    if !within(&add(grant.spent, *ceiling)?, &grant.limit) {
        return Err(RpcError::new(BUDGET, "Donation limit reached"));
    }
    Ok(())
}

/// Settles `reservation` against `grant`: charges the reported usage, or the full ceiling when
/// none is reported. Returns the grant after it and the usage recorded.
pub(crate) fn settle(
    grant: &Grant,
    reservation: &Reservation,
    reported: Option<&Usage>,
) -> Result<(Grant, Usage), RpcError> {
    let usage = match reported {
        Some(u) => u.clone(),
        None => Usage {
            input_tokens: reservation.ceiling.tokens,
            output_tokens: 0,
            cache_read_tokens: 0,
            cost_micros: reservation.ceiling.cost_micros,
            source: Source::Reservation,
            cost_source: Some(Source::Reservation),
        },
    };
    // Cache reads are a subset of input; they are never charged twice.
    if usage.cache_read_tokens > usage.input_tokens {
        return Err(RpcError::invalid_params("Cache reads exceed input tokens"));
    }
    let tokens = usage
        .input_tokens
        .checked_add(usage.output_tokens)
        .ok_or_else(|| RpcError::new(BUDGET, "Allowance overflow"))?;
    let spent = add(
        grant.spent,
        Allowance {
            tokens,
            cost_micros: usage.cost_micros,
            turns: 1,
        },
    )?;
    let mut after = grant.clone();
    after.revoked = grant.revoked || !within(&spent, &grant.limit);
    after.spent = spent;
    Ok((after, usage))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::axp::state::Enforcement;
    use crate::error::INVALID_PARAMS;

    fn allowance(tokens: u64, cost_micros: u64, turns: u64) -> Allowance {
        Allowance {
            tokens,
            cost_micros,
            turns,
        }
    }

    fn grant(limit: Allowance, spent: Allowance) -> Grant {
        Grant {
            id: "g".into(),
            owner: "o".into(),
            limit,
            spent,
            revoked: false,
            enforcement: Enforcement::Accounting,
        }
    }

    fn reservation(ceiling: Allowance) -> Reservation {
        Reservation {
            turn_id: "t".into(),
            grant_id: "g".into(),
            epoch: 1,
            ceiling,
            started_at: 0,
        }
    }

    fn usage(input: u64, output: u64, cache: u64, cost: u64) -> Usage {
        Usage {
            input_tokens: input,
            output_tokens: output,
            cache_read_tokens: cache,
            cost_micros: cost,
            source: Source::Reported,
            cost_source: None,
        }
    }

    #[test]
    fn sums_are_checked_against_safe_integers() {
        assert_eq!(
            add(allowance(1, 2, 3), allowance(4, 5, 6)),
            Ok(allowance(5, 7, 9))
        );
        let max = allowance(COUNT_MAX, 0, 0);
        assert_eq!(
            add(max, allowance(1, 0, 0)).map_err(|e| e.code),
            Err(BUDGET)
        );
        assert_eq!(
            add(allowance(0, u64::MAX, 0), allowance(0, 1, 0)).map_err(|e| e.code),
            Err(BUDGET)
        );
    }

    #[test]
    fn a_reservation_is_one_turn_with_tokens_within_what_is_left() {
        let g = grant(allowance(100, 100, 2), allowance(50, 0, 1));
        assert_eq!(reserve(&g, &allowance(50, 100, 1)), Ok(()));
        assert_eq!(
            reserve(&g, &allowance(51, 0, 1)).map_err(|e| e.code),
            Err(BUDGET)
        );
        assert_eq!(
            reserve(&g, &allowance(10, 0, 2)).map_err(|e| e.code),
            Err(INVALID_PARAMS)
        );
        assert_eq!(
            reserve(&g, &allowance(0, 0, 1)).map_err(|e| e.code),
            Err(INVALID_PARAMS)
        );
        let mut revoked = g.clone();
        revoked.revoked = true;
        assert_eq!(
            reserve(&revoked, &allowance(1, 0, 1)).map_err(|e| e.code),
            Err(BUDGET)
        );
    }

    #[test]
    fn settling_charges_the_report_or_the_whole_ceiling_and_an_overspend_revokes() {
        let g = grant(allowance(1000, 1000, 5), Allowance::default());
        let r = reservation(allowance(300, 40, 1));
        let (after, u) = settle(&g, &r, Some(&usage(100, 20, 80, 7))).expect("settle");
        assert_eq!(after.spent, allowance(120, 7, 1));
        assert!(!after.revoked);
        assert_eq!(u.source, Source::Reported);
        let (after, u) = settle(&g, &r, None).expect("settle");
        assert_eq!(after.spent, allowance(300, 40, 1));
        assert_eq!(
            (u.source, u.cost_source),
            (Source::Reservation, Some(Source::Reservation))
        );
        let (after, _) = settle(&g, &r, Some(&usage(990, 20, 0, 1))).expect("overspend");
        assert_eq!(after.spent.tokens, 1010);
        assert!(
            after.revoked,
            "a truthful overspend is recorded and revokes"
        );
        assert_eq!(
            settle(&g, &r, Some(&usage(1, 0, 2, 0))).map_err(|e| e.code),
            Err(INVALID_PARAMS)
        );
    }
}
