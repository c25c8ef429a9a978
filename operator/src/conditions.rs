//! Condition bookkeeping: transition times move only when the status does.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// Sets a condition; returns whether its status changed (a transition worth
/// an event). Reason and message are updated either way.
pub fn set_condition(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: bool,
    reason: &str,
    message: &str,
    generation: Option<i64>,
) -> bool {
    let status = if status { "True" } else { "False" };
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    match conditions.iter_mut().find(|c| c.type_ == type_) {
        Some(c) => {
            let changed = c.status != status;
            if changed {
                c.last_transition_time = now;
                c.status = status.into();
            }
            c.reason = reason.into();
            c.message = message.into();
            c.observed_generation = generation;
            changed
        }
        None => {
            conditions.push(Condition {
                type_: type_.into(),
                status: status.into(),
                reason: reason.into(),
                message: message.into(),
                observed_generation: generation,
                last_transition_time: now,
            });
            true
        }
    }
}

/// Removes a condition.
pub fn remove(conditions: &mut Vec<Condition>, type_: &str) {
    conditions.retain(|c| c.type_ != type_);
}

/// Looks a condition up.
pub fn get<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transition_time_moves_only_on_status_change() {
        let mut c = Vec::new();
        assert!(set_condition(&mut c, "Ready", false, "A", "a", Some(1)));
        let t = c[0].last_transition_time.clone();
        assert!(!set_condition(&mut c, "Ready", false, "B", "b", Some(1)));
        assert_eq!(c[0].last_transition_time, t);
        assert_eq!(c[0].reason, "B");
        assert!(set_condition(&mut c, "Ready", true, "C", "c", Some(2)));
        assert_eq!(get(&c, "Ready").unwrap().status, "True");
    }
}
