//! Delivery planning: which endpoints an Event reaches (its [`Audience`], its type against
//! the subscriptions) and the Deliveries to write for it, as the columns of one `unnest`
//! insert. Pure, and used by the ingest (accept.rs) and the Replay engine (replay.rs) alike,
//! so an Event's audience is decided in one place and a Replay never widens it.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

use railhook_common::EventType;
use railhook_common::ids::{DeliveryId, EventId};

use crate::group_commit::Inserted;
use crate::store::subscriptions::{Candidate, Subscriptions};

pub(crate) mod filtered;

pub(crate) use filtered::{Filtered, Route, Tables};

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

/// The Deliveries to create: the unfiltered ones as parallel columns for one `unnest`
/// insert, with ids fixed now, and the filtered candidates (filtered.rs), which the
/// statement writes only where their filter holds.
#[derive(Default, Clone)]
pub(crate) struct DeliveryPlan {
    pub(crate) ids: Vec<String>,
    pub(crate) event_ids: Vec<String>,
    pub(crate) endpoint_ids: Vec<String>,
    pub(crate) subscription_ids: Vec<String>,
    pub(crate) ordered: Vec<bool>,
    pub(crate) filtered: Filtered,
    /// One per planned Event, in order: its id and which Deliveries and candidates are its.
    /// A candidate names its Event by position here (1-based).
    pub(crate) spans: Vec<Span>,
}

#[derive(Clone, Debug)]
pub(crate) struct Span {
    pub(crate) event_id: String,
    pub(crate) unfiltered: Range<usize>,
    pub(crate) filtered: Range<usize>,
}

/// A Delivery the statement wrote, as the answer and the Sequence Numbers need it.
#[derive(Clone, Debug)]
pub(crate) struct Written {
    pub(crate) id: String,
    pub(crate) endpoint_id: String,
    pub(crate) ordered: bool,
}

impl DeliveryPlan {
    /// Appends `other`, whose Events follow this plan's.
    pub(crate) fn append(&mut self, other: &DeliveryPlan) {
        let (unfiltered, filtered) = (self.ids.len(), self.filtered.len());
        let events = self.spans.len() as i32;
        self.ids.extend_from_slice(&other.ids);
        self.event_ids.extend_from_slice(&other.event_ids);
        self.endpoint_ids.extend_from_slice(&other.endpoint_ids);
        self.subscription_ids
            .extend_from_slice(&other.subscription_ids);
        self.ordered.extend_from_slice(&other.ordered);
        self.filtered.append(&other.filtered, events);
        self.spans.extend(other.spans.iter().map(|s| Span {
            event_id: s.event_id.clone(),
            unfiltered: s.unfiltered.start + unfiltered..s.unfiltered.end + unfiltered,
            filtered: s.filtered.start + filtered..s.filtered.end + filtered,
        }));
    }

    /// What the statement wrote for each planned Event, in plan order: nothing for an Event
    /// it did not insert, else its unfiltered Deliveries and the candidates that passed.
    pub(crate) fn written(&self, inserted: &Inserted) -> Vec<Vec<Written>> {
        self.spans
            .iter()
            .map(|span| {
                if !inserted.contains_key(&span.event_id) {
                    return Vec::new();
                }
                let unfiltered = span.unfiltered.clone().map(|d| Written {
                    id: self.ids[d].clone(),
                    endpoint_id: self.endpoint_ids[d].clone(),
                    ordered: self.ordered[d],
                });
                let passed = span.filtered.clone().filter_map(|c| {
                    let id = inserted.passed.get(&c)?;
                    let (endpoint_id, _, ordered) = self.filtered.route_of_candidate(c);
                    Some(Written {
                        id: id.clone(),
                        endpoint_id: endpoint_id.to_owned(),
                        ordered,
                    })
                });
                unfiltered.chain(passed).collect()
            })
            .collect()
    }
}

/// What planning needs of one snapshot of a project's subscriptions, computed once per
/// snapshot (`store::subscriptions::Subscriptions` keeps it beside them, and the sender
/// cache keeps that for a second), so that a candidate costs no text per Event.
#[derive(Clone, Debug, Default)]
pub struct Prepared {
    pub(crate) tables: Arc<Tables>,
    /// Per subscription: the numbers of its filter and route, if it has a filter.
    numbers: Vec<Option<(i32, i32)>>,
    /// Per subscription: whether another subscription of the snapshot is on its endpoint.
    shared: Vec<bool>,
}

impl Prepared {
    pub(crate) fn new(subs: &[Candidate]) -> Self {
        let mut tables = Tables::default();
        let numbers = subs
            .iter()
            .map(|sub| {
                let filter = sub.filter()?;
                Some((
                    tables.filter(&filter),
                    tables.route(route(sub, sub.ordered)),
                ))
            })
            .collect();
        let mut per_endpoint: HashMap<&str, usize> = HashMap::new();
        for sub in subs {
            *per_endpoint.entry(&sub.endpoint_id).or_default() += 1;
        }
        let shared = subs
            .iter()
            .map(|sub| per_endpoint[sub.endpoint_id.as_str()] > 1)
            .collect();
        tables.seal();
        Self {
            tables: Arc::new(tables),
            numbers,
            shared,
        }
    }
}

/// Plans Events against one snapshot of a project's subscriptions into one [`DeliveryPlan`].
pub(crate) struct Planner<'a> {
    subs: &'a [Candidate],
    prepared: &'a Prepared,
    plan: DeliveryPlan,
}

/// What one endpoint gets from the subscriptions of an Event that match it.
struct Choice {
    first: usize,
    ordered: bool,
    filter: Joined,
}

enum Joined {
    None,
    /// The first subscription's own filter.
    Own,
    Text(String),
}

impl<'a> Planner<'a> {
    pub(crate) fn new(subs: &'a Subscriptions) -> Self {
        let prepared = subs.prepared();
        Self {
            subs,
            prepared,
            plan: DeliveryPlan {
                filtered: Filtered::new(prepared.tables.clone()),
                ..DeliveryPlan::default()
            },
        }
    }

    pub(crate) fn finish(self) -> DeliveryPlan {
        self.plan
    }

    /// One Delivery per (Event, endpoint) of the Event's audience: an endpoint with two
    /// matching subscriptions still gets the Event once (ordered if either subscription asks
    /// for order). Of several matching subscriptions, the Delivery is declined only if every
    /// one's filter declines: the filters are joined with `||`, and an unfiltered one drops
    /// the filter. This is the one place an Event's scope and channels are decided, so the
    /// Deliveries stored with an Event can never disagree with them.
    pub(crate) fn plan(&mut self, event: &EventId, event_type: &EventType, audience: &Audience) {
        let (subs, prepared) = (self.subs, self.prepared);
        // Only endpoints with several subscriptions need to be told apart.
        let mut seen: HashMap<&str, usize> = HashMap::new();
        let mut chosen: Vec<Choice> = Vec::new();
        for (at, sub) in subs
            .iter()
            .enumerate()
            .filter(|(_, s)| audience.admits(s) && s.patterns.iter().any(|p| p.matches(event_type)))
        {
            let shared = prepared.shared[at];
            if let Some(&c) = seen.get(sub.endpoint_id.as_str()).filter(|_| shared) {
                let choice: &mut Choice = &mut chosen[c];
                choice.ordered |= sub.ordered;
                choice.filter = match (&choice.filter, sub.filter()) {
                    (Joined::None, _) | (_, None) => Joined::None,
                    (Joined::Own, Some(b)) => {
                        let a = subs[choice.first].filter().unwrap_or_default();
                        Joined::Text(format!("({a}) || ({b})"))
                    }
                    (Joined::Text(a), Some(b)) => Joined::Text(format!("({a}) || ({b})")),
                };
                continue;
            }
            let own = sub.endpoint_filter.is_some() || sub.subscription_filter.is_some();
            if shared {
                seen.insert(&sub.endpoint_id, chosen.len());
            }
            chosen.push(Choice {
                first: at,
                ordered: sub.ordered,
                filter: if own { Joined::Own } else { Joined::None },
            });
        }
        let plan = &mut self.plan;
        let position = plan.spans.len() as i32 + 1;
        let (unfiltered, filtered) = (plan.ids.len(), plan.filtered.len());
        for choice in chosen {
            let sub = &subs[choice.first];
            match choice.filter {
                Joined::None => {
                    plan.ids.push(DeliveryId::generate().into_string());
                    plan.event_ids.push(event.as_str().to_owned());
                    plan.endpoint_ids.push(sub.endpoint_id.clone());
                    plan.subscription_ids.push(sub.subscription_id.clone());
                    plan.ordered.push(choice.ordered);
                }
                Joined::Own => match prepared.numbers[choice.first] {
                    Some((filter, route)) if choice.ordered == sub.ordered => {
                        plan.filtered.push_indexed(position, filter, route);
                    }
                    // Ordered only through another of its endpoint's subscriptions.
                    _ => {
                        let filter = sub.filter().unwrap_or_default();
                        plan.filtered
                            .push(position, &filter, route(sub, choice.ordered));
                    }
                },
                Joined::Text(filter) => {
                    plan.filtered
                        .push(position, &filter, route(sub, choice.ordered));
                }
            }
        }
        plan.spans.push(Span {
            event_id: event.as_str().to_owned(),
            unfiltered: unfiltered..plan.ids.len(),
            filtered: filtered..plan.filtered.len(),
        });
    }
}

fn route(sub: &Candidate, ordered: bool) -> Route {
    Route {
        endpoint_id: sub.endpoint_id.clone(),
        subscription_id: sub.subscription_id.clone(),
        ordered,
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
            let subs = Subscriptions::new(subs.to_vec());
            let mut planner = Planner::new(&subs);
            let event_type = EventType::parse("order.paid").expect("type");
            planner.plan(&EventId::generate(), &event_type, &who);
            assert_eq!(planner.finish().endpoint_ids, expected, "{who:?}");
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
        let subs = Subscriptions::new(subs.to_vec());
        let mut planner = Planner::new(&subs);
        // Twice: the second Event reuses what the first learnt per subscription.
        planner.plan(&EventId::generate(), &event_type, &Audience::default());
        planner.plan(&EventId::generate(), &event_type, &Audience::default());
        let plan = planner.finish();
        assert_eq!(plan.endpoint_ids, ["d", "e", "d", "e"], "unfiltered");
        let got: Vec<(i32, &str, &str)> = (0..plan.filtered.len())
            .map(|c| {
                (
                    plan.filtered.events[c],
                    plan.filtered.route_of_candidate(c).0,
                    plan.filtered.filter_text(c),
                )
            })
            .collect();
        let first = [
            ("a", "$.x > 1"),
            ("b", "($.x > 1) && ($.y == 2)"),
            ("c", "($.y == 2) || ($.z == 3)"),
        ];
        let expected: Vec<(i32, &str, &str)> = [1, 2]
            .into_iter()
            .flat_map(|e| first.iter().map(move |&(ep, f)| (e, ep, f)))
            .collect();
        assert_eq!(got, expected);
        let columns = plan.filtered.columns();
        assert_eq!(columns.filters.len(), 3, "each filter once");
        assert_eq!(columns.route_endpoints, ["a", "b", "c"], "each route once");
        assert_eq!(
            plan.filtered.filter_of[..3],
            plan.filtered.filter_of[3..],
            "the second Event's candidates reuse the numbers"
        );
        assert_eq!(plan.spans[1].unfiltered, 2..4);
        assert_eq!(plan.spans[1].filtered, 3..6);
    }
}
