//! Delivery planning: which endpoints an Event reaches (its [`Audience`], its type against
//! the subscriptions) and the Deliveries to write for it, as the columns of one `unnest`
//! insert. Pure, and used by the ingest (accept.rs) and the Replay engine (replay.rs) alike,
//! so an Event's audience is decided in one place and a Replay never widens it.

use std::collections::HashMap;

use railhook_common::EventType;
use railhook_common::ids::{DeliveryId, EventId};

use crate::store::subscriptions::Candidate;

/// Which endpoints an Event may reach besides those its type selects (docs/APPLICATIONS.md):
/// the endpoints of its own scope only — its application's, or with none the project's own —
/// and, of those, only endpoints that list no channels or share one with it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Audience {
    pub application_id: Option<String>,
    /// 1–10 channels, validated (`routes::channels`); `None`: sent on no channel.
    pub channels: Option<Vec<String>>,
}

impl Audience {
    /// Whether the endpoint of `sub` is in this audience. The invariant that keeps one
    /// customer's Events away from another's endpoints is the first comparison: a scope is
    /// equal or it is not, and a project Event (`None`) never reaches an application's
    /// endpoint, nor the reverse.
    pub(crate) fn admits(&self, sub: &Candidate) -> bool {
        if sub.application_id != self.application_id {
            return false;
        }
        match sub.channels.as_deref() {
            Some(listed) if !listed.is_empty() => self
                .channels
                .as_deref()
                .is_some_and(|mine| mine.iter().any(|c| listed.contains(c))),
            _ => true,
        }
    }
}

/// The Deliveries to create, as parallel columns for one `unnest` insert.
#[derive(Default, Clone)]
pub(crate) struct DeliveryPlan {
    pub(crate) ids: Vec<String>,
    pub(crate) event_ids: Vec<String>,
    pub(crate) endpoint_ids: Vec<String>,
    pub(crate) subscription_ids: Vec<String>,
    pub(crate) ordered: Vec<bool>,
    /// The payload filter the statement applies to each (`None`: none), as
    /// [`Candidate::filter`] combines it.
    pub(crate) filters: Vec<Option<String>>,
}

impl DeliveryPlan {
    pub(crate) fn append(&mut self, other: &DeliveryPlan) {
        self.ids.extend_from_slice(&other.ids);
        self.event_ids.extend_from_slice(&other.event_ids);
        self.endpoint_ids.extend_from_slice(&other.endpoint_ids);
        self.subscription_ids
            .extend_from_slice(&other.subscription_ids);
        self.ordered.extend_from_slice(&other.ordered);
        self.filters.extend_from_slice(&other.filters);
    }

    /// The planned Deliveries that `keep` keeps (given the Event id and the Delivery id).
    pub(crate) fn keep(&self, keep: impl Fn(&str, &str) -> bool) -> DeliveryPlan {
        let mut out = DeliveryPlan::default();
        for n in (0..self.ids.len()).filter(|&n| keep(&self.event_ids[n], &self.ids[n])) {
            out.ids.push(self.ids[n].clone());
            out.event_ids.push(self.event_ids[n].clone());
            out.endpoint_ids.push(self.endpoint_ids[n].clone());
            out.subscription_ids.push(self.subscription_ids[n].clone());
            out.ordered.push(self.ordered[n]);
            out.filters.push(self.filters[n].clone());
        }
        out
    }
}

/// One Delivery per (Event, endpoint) of the Event's audience: an endpoint with two matching
/// subscriptions still gets the Event once (ordered if either subscription asks for order).
/// Of several matching subscriptions, the Delivery is declined only if every one's filter
/// declines: the filters are joined with `||`, and an unfiltered one drops the filter.
/// This is the one place an Event's scope and channels are decided, so the Deliveries stored
/// with an Event can never disagree with them.
pub(crate) fn plan_deliveries(
    event: &EventId,
    event_type: &EventType,
    audience: &Audience,
    subs: &[Candidate],
    plan: &mut DeliveryPlan,
) {
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for sub in subs
        .iter()
        .filter(|s| audience.admits(s) && s.patterns.iter().any(|p| p.matches(event_type)))
    {
        if let Some(&at) = seen.get(sub.endpoint_id.as_str()) {
            plan.ordered[at] |= sub.ordered;
            plan.filters[at] = match (plan.filters[at].take(), sub.filter()) {
                (Some(a), Some(b)) => Some(format!("({a}) || ({b})")),
                _ => None,
            };
            continue;
        }
        seen.insert(&sub.endpoint_id, plan.ids.len());
        plan.ids.push(DeliveryId::generate().into_string());
        plan.event_ids.push(event.as_str().to_owned());
        plan.endpoint_ids.push(sub.endpoint_id.clone());
        plan.subscription_ids.push(sub.subscription_id.clone());
        plan.ordered.push(sub.ordered);
        plan.filters.push(sub.filter());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use railhook_common::EventTypePattern;

    fn sub(endpoint: &str, application: Option<&str>, channels: Option<&[&str]>) -> Candidate {
        Candidate {
            subscription_id: format!("sub_{endpoint}"),
            endpoint_id: endpoint.to_owned(),
            patterns: vec![EventTypePattern::from_trusted("*".to_owned())],
            ordered: false,
            application_id: application.map(str::to_owned),
            channels: channels.map(|c| c.iter().map(|s| (*s).to_owned()).collect()),
            endpoint_filter: None,
            subscription_filter: None,
        }
    }

    fn audience(application: Option<&str>, channels: Option<&[&str]>) -> Audience {
        Audience {
            application_id: application.map(str::to_owned),
            channels: channels.map(|c| c.iter().map(|s| (*s).to_owned()).collect()),
        }
    }

    #[test]
    fn an_event_reaches_its_own_scope_and_shared_channels_only() {
        let subs = [
            sub("project", None, None),
            sub("project_eu", None, Some(&["eu"])),
            sub("a", Some("app_a"), None),
            sub("a_empty_list", Some("app_a"), Some(&[])),
            sub("a_eu", Some("app_a"), Some(&["eu"])),
            sub("b", Some("app_b"), None),
        ];
        let cases: [(Audience, &[&str]); 5] = [
            (audience(None, None), &["project"]),
            (audience(None, Some(&["eu"])), &["project", "project_eu"]),
            (audience(Some("app_a"), None), &["a", "a_empty_list"]),
            (
                audience(Some("app_a"), Some(&["us", "eu"])),
                &["a", "a_empty_list", "a_eu"],
            ),
            (audience(Some("app_b"), Some(&["eu"])), &["b"]),
        ];
        for (who, expected) in cases {
            let mut plan = DeliveryPlan::default();
            let event_type = EventType::parse("order.paid").expect("type");
            plan_deliveries(&EventId::generate(), &event_type, &who, &subs, &mut plan);
            assert_eq!(plan.endpoint_ids, expected, "{who:?}");
        }
    }

    #[test]
    fn filters_join_per_endpoint_and_an_unfiltered_subscription_drops_them() {
        let filtered = |endpoint: &str, own: Option<&str>, sub_filter: Option<&str>, n: u8| {
            let mut s = sub(endpoint, None, None);
            s.subscription_id = format!("sub_{endpoint}_{n}");
            s.endpoint_filter = own.map(str::to_owned);
            s.subscription_filter = sub_filter.map(str::to_owned);
            s
        };
        let subs = [
            filtered("a", Some("$.x > 1"), None, 0),
            filtered("b", Some("$.x > 1"), Some("$.y == 2"), 0),
            filtered("c", None, Some("$.y == 2"), 0),
            filtered("c", None, Some("$.z == 3"), 1),
            filtered("d", None, Some("$.y == 2"), 0),
            filtered("d", None, None, 1),
            filtered("e", None, None, 0),
        ];
        let event_type = EventType::parse("order.paid").expect("type");
        let mut plan = DeliveryPlan::default();
        plan_deliveries(
            &EventId::generate(),
            &event_type,
            &Audience::default(),
            &subs,
            &mut plan,
        );
        let got: Vec<(&str, Option<&str>)> = plan
            .endpoint_ids
            .iter()
            .map(String::as_str)
            .zip(plan.filters.iter().map(Option::as_deref))
            .collect();
        assert_eq!(
            got,
            vec![
                ("a", Some("$.x > 1")),
                ("b", Some("($.x > 1) && ($.y == 2)")),
                ("c", Some("($.y == 2) || ($.z == 3)")),
                ("d", None),
                ("e", None),
            ]
        );
    }
}
