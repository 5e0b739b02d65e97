//! Filtered candidates: the Deliveries a payload filter decides, planned as three integers
//! each (the Event, the filter, the route) over tables of the distinct filters and routes,
//! as `railhook_ingest()` takes them (migration 20261206000027). The statement writes a
//! candidate only if its filter holds for its Event's payload, and answers with the
//! positions it wrote; the id of each is derived here and in SQL alike
//! ([`filtered_delivery_id`]), so a declined candidate costs no id, no text and no row.
//!
//! Why this shape: one row per planned Delivery, with its id, texts and joins, cost more
//! than the filters themselves once an Event had 100 filtered endpoints
//! (docs/BENCHMARKS-HISTORY.md, "Payload filters").

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use sha2::{Digest, Sha256};

/// Base-32 digits of a ULID (Crockford's, lower case as our ids are).
const DIGITS: &[u8; 32] = b"0123456789abcdefghjkmnpqrstvwxyz";

/// Candidates per statement: 6 base-32 digits number each (`railhook_filtered_delivery_id`).
pub(crate) const MAX_CANDIDATES: usize = 1 << 30;

/// The id of the Delivery that the candidate at 1-based position `n` of its statement writes
/// for Event `event_id` (`evt_` and a ULID): `dlv_`, the first 20 characters of the Event's
/// ULID (its time and 50 random bits), and `n` in 6 base-32 digits. The SQL function
/// `railhook_filtered_delivery_id` computes the same; the Delivery shares its Event's day.
pub(crate) fn filtered_delivery_id(event_id: &str, n: usize) -> String {
    debug_assert!(n < MAX_CANDIDATES);
    let ulid = event_id.get(4..24).unwrap_or_default();
    let mut id = String::with_capacity(30);
    id.push_str("dlv_");
    id.push_str(ulid);
    for shift in [25, 20, 15, 10, 5, 0] {
        id.push(char::from(DIGITS[(n >> shift) & 31]));
    }
    id
}

/// Where a filtered Delivery goes if its filter holds.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Route {
    pub(crate) endpoint_id: String,
    pub(crate) subscription_id: String,
    pub(crate) ordered: bool,
}

/// Distinct filters and routes, each numbered from 1 in its order.
#[derive(Default, Clone, Debug)]
pub(crate) struct Tables {
    pub(crate) filters: Vec<String>,
    pub(crate) route_endpoints: Vec<String>,
    pub(crate) route_subscriptions: Vec<String>,
    pub(crate) route_ordered: Vec<bool>,
    filter_index: HashMap<String, i32>,
    route_index: HashMap<Route, i32>,
    /// Set once the tables are complete (a snapshot's: [`Tables::seal`]).
    seal: Option<Seal>,
}

/// A snapshot's tables as Postgres keeps them parsed (`filter_tables`, migration
/// 20261206000028): the SHA-256 of their content names the row, and `stored` says that a
/// statement of this snapshot found or stored it, so later statements send the digest
/// without the texts. Content addressed, so the sender cache's reload of an unchanged
/// snapshot every second finds the same row.
#[derive(Clone, Debug)]
pub(crate) struct Seal {
    pub(crate) digest: [u8; 32],
    stored: Arc<AtomicBool>,
}

/// The fewest filters a snapshot's tables need to be named by digest: below it, parsing the
/// few a statement uses costs no more than reading the row (~4 µs).
const STORED_MIN_FILTERS: usize = 8;

impl Seal {
    pub(crate) fn is_stored(&self) -> bool {
        self.stored.load(Ordering::Relaxed)
    }

    pub(crate) fn mark_stored(&self) {
        self.stored.store(true, Ordering::Relaxed);
    }
}

impl Tables {
    /// The number of `filter`, added if new.
    pub(crate) fn filter(&mut self, filter: &str) -> i32 {
        if let Some(&at) = self.filter_index.get(filter) {
            return at;
        }
        self.filters.push(filter.to_owned());
        let at = self.filters.len() as i32;
        self.filter_index.insert(filter.to_owned(), at);
        at
    }

    /// The number of `route`, added if new.
    pub(crate) fn route(&mut self, route: Route) -> i32 {
        if let Some(&at) = self.route_index.get(&route) {
            return at;
        }
        self.route_endpoints.push(route.endpoint_id.clone());
        self.route_subscriptions.push(route.subscription_id.clone());
        self.route_ordered.push(route.ordered);
        let at = self.route_endpoints.len() as i32;
        self.route_index.insert(route, at);
        at
    }

    /// Completes the tables of a snapshot: from now on a statement may name them by their
    /// digest. Each field is length-prefixed, so no two contents share an encoding.
    pub(crate) fn seal(&mut self) {
        let mut h = Sha256::new();
        h.update(b"railhook filter tables v1\0");
        let mut text = |t: &str| {
            h.update((t.len() as u64).to_le_bytes());
            h.update(t.as_bytes());
        };
        for f in &self.filters {
            text(f);
        }
        for (e, s) in self.route_endpoints.iter().zip(&self.route_subscriptions) {
            text(e);
            text(s);
        }
        h.update((self.filters.len() as u64).to_le_bytes());
        h.update((self.route_endpoints.len() as u64).to_le_bytes());
        for &o in &self.route_ordered {
            h.update([u8::from(o)]);
        }
        self.seal = Some(Seal {
            digest: h.finalize().into(),
            stored: Arc::default(),
        });
    }

    pub(crate) fn sealed(&self) -> Option<&Seal> {
        self.seal.as_ref()
    }

    /// Whether a statement whose candidates use `used` of these filters should name the
    /// stored tables rather than send the texts of those it uses: reading the row costs
    /// about a twentieth of parsing for each filter it holds (measured, migration
    /// 20261206000028), so when the statement uses at least an eighth of them.
    fn worth_storing(&self, used: usize) -> bool {
        self.seal.is_some()
            && self.filters.len() >= STORED_MIN_FILTERS
            && used * 8 >= self.filters.len()
    }
}

/// The filtered candidates of a plan. A filter or route is numbered in the snapshot's own
/// [`Tables`] (shared by every request planned from that snapshot, built once:
/// `store::subscriptions::Subscriptions`) up to their length, and past it in this plan's
/// `extra` ones (filters joined for an endpoint two subscriptions match, or entries of
/// another snapshot met when plans are appended). So planning a candidate, and appending
/// the plans of requests of one snapshot, moves three integers and no text.
#[derive(Default, Clone)]
pub(crate) struct Filtered {
    base: Option<Arc<Tables>>,
    extra: Tables,
    /// Per candidate: its Event (1-based position in the plan's Events), filter and route.
    pub(crate) events: Vec<i32>,
    pub(crate) filter_of: Vec<i32>,
    pub(crate) route_of: Vec<i32>,
}

/// A statement's filtered columns, as `railhook_ingest()` takes them. Either the snapshot's
/// stored tables (`tables`) by their numbers and, numbered after them, the other filters and
/// routes the candidates use; or, without `tables`, only the filters and routes the
/// candidates use, renumbered.
pub(crate) struct Columns<'a> {
    pub(crate) tables: Option<&'a Tables>,
    pub(crate) filters: Vec<&'a str>,
    pub(crate) route_endpoints: Vec<&'a str>,
    pub(crate) route_subscriptions: Vec<&'a str>,
    pub(crate) route_ordered: Vec<bool>,
    pub(crate) filter_of: Vec<i32>,
    pub(crate) route_of: Vec<i32>,
}

impl Filtered {
    pub(crate) fn new(base: Arc<Tables>) -> Self {
        Self {
            base: Some(base),
            ..Self::default()
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.events.len()
    }

    fn base_len(&self) -> (i32, i32) {
        self.base.as_ref().map_or((0, 0), |b| {
            (b.filters.len() as i32, b.route_endpoints.len() as i32)
        })
    }

    /// Adds a candidate for the Event at 1-based position `event`, through filter and route
    /// numbers of the base tables.
    pub(crate) fn push_indexed(&mut self, event: i32, filter: i32, route: i32) {
        self.events.push(event);
        self.filter_of.push(filter);
        self.route_of.push(route);
    }

    /// Adds a candidate whose filter or route the base tables may not have.
    pub(crate) fn push(&mut self, event: i32, filter: &str, route: Route) {
        let (filters, routes) = self.base_len();
        let filter = filters + self.extra.filter(filter);
        let route = routes + self.extra.route(route);
        self.push_indexed(event, filter, route);
    }

    fn filter_text_of(&self, n: i32) -> &str {
        let (filters, _) = self.base_len();
        match &self.base {
            Some(base) if n <= filters => &base.filters[n as usize - 1],
            _ => &self.extra.filters[(n - filters) as usize - 1],
        }
    }

    fn route_by(&self, n: i32) -> (&str, &str, bool) {
        let (_, routes) = self.base_len();
        let (t, r) = match &self.base {
            Some(base) if n <= routes => (&**base, n as usize - 1),
            _ => (&self.extra, (n - routes) as usize - 1),
        };
        (
            &t.route_endpoints[r],
            &t.route_subscriptions[r],
            t.route_ordered[r],
        )
    }

    /// The filter text of candidate `at` (0-based).
    pub(crate) fn filter_text(&self, at: usize) -> &str {
        self.filter_text_of(self.filter_of[at])
    }

    /// The route of candidate `at` (0-based).
    pub(crate) fn route_of_candidate(&self, at: usize) -> (&str, &str, bool) {
        self.route_by(self.route_of[at])
    }

    /// Appends `other`'s candidates, whose Events follow this plan's first `events` ones.
    /// Of the same snapshot (the common case: requests of one second), its numbers hold
    /// as they are; otherwise its filters and routes are added by their text.
    pub(crate) fn append(&mut self, other: &Filtered, events: i32) {
        if self.len() == 0 && self.extra.filters.is_empty() && self.extra.route_endpoints.is_empty()
        {
            self.base.clone_from(&other.base);
        }
        let same = match (&self.base, &other.base) {
            // Equal digests: the same tables, reloaded (the sender cache's second).
            (Some(a), Some(b)) => {
                Arc::ptr_eq(a, b)
                    || matches!((&a.seal, &b.seal), (Some(x), Some(y)) if x.digest == y.digest)
            }
            (None, None) => true,
            _ => false,
        };
        let (filters, routes) = if same { other.base_len() } else { (0, 0) };
        for c in 0..other.len() {
            let (f, r) = (other.filter_of[c], other.route_of[c]);
            let filter = if f <= filters {
                f
            } else {
                let (mine, _) = self.base_len();
                mine + self.extra.filter(other.filter_text_of(f))
            };
            let route = if r <= routes {
                r
            } else {
                let (endpoint_id, subscription_id, ordered) = other.route_by(r);
                let (_, mine) = self.base_len();
                mine + self.extra.route(Route {
                    endpoint_id: endpoint_id.to_owned(),
                    subscription_id: subscription_id.to_owned(),
                    ordered,
                })
            };
            self.push_indexed(other.events[c] + events, filter, route);
        }
    }

    /// The statement's columns: the snapshot's stored tables when the candidates use enough
    /// of them, and each other filter and route the candidates use, once.
    pub(crate) fn columns(&self) -> Columns<'_> {
        let (base_filters, base_routes) = self.base_len();
        // Old number (1-based) → new number; 0: not used yet.
        let mut filters = vec![0; base_filters as usize + self.extra.filters.len() + 1];
        let mut routes = vec![0; base_routes as usize + self.extra.route_endpoints.len() + 1];
        let used = {
            let mut seen = vec![false; base_filters as usize + 1];
            self.filter_of
                .iter()
                .filter(|&&f| f <= base_filters && !std::mem::replace(&mut seen[f as usize], true))
                .count()
        };
        let tables = self.base.as_deref().filter(|b| b.worth_storing(used));
        let (mut next_filter, mut next_route) = (0, 0);
        if tables.is_some() {
            // The stored tables keep their numbers.
            for f in 1..=base_filters {
                filters[f as usize] = f;
            }
            for r in 1..=base_routes {
                routes[r as usize] = r;
            }
            (next_filter, next_route) = (base_filters, base_routes);
        }
        let mut out = Columns {
            tables,
            filters: Vec::new(),
            route_endpoints: Vec::new(),
            route_subscriptions: Vec::new(),
            route_ordered: Vec::new(),
            filter_of: Vec::with_capacity(self.len()),
            route_of: Vec::with_capacity(self.len()),
        };
        for c in 0..self.len() {
            let (f, r) = (self.filter_of[c], self.route_of[c]);
            if filters[f as usize] == 0 {
                out.filters.push(self.filter_text_of(f));
                next_filter += 1;
                filters[f as usize] = next_filter;
            }
            if routes[r as usize] == 0 {
                let (endpoint, subscription, ordered) = self.route_by(r);
                out.route_endpoints.push(endpoint);
                out.route_subscriptions.push(subscription);
                out.route_ordered.push(ordered);
                next_route += 1;
                routes[r as usize] = next_route;
            }
            out.filter_of.push(filters[f as usize]);
            out.route_of.push(routes[r as usize]);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_ids_are_delivery_ids_of_the_events_time() {
        let event = railhook_common::ids::EventId::generate();
        let first = filtered_delivery_id(event.as_str(), 1);
        let last = filtered_delivery_id(event.as_str(), MAX_CANDIDATES - 1);
        for id in [&first, &last] {
            railhook_common::ids::DeliveryId::parse(id).expect("a delivery id");
            assert_eq!(id[4..14], event.as_str()[4..14], "the Event's time");
        }
        assert!(first.ends_with("000001"));
        assert!(last.ends_with("zzzzzz"));
        assert_ne!(first, filtered_delivery_id(event.as_str(), 2));
    }

    fn route(e: &str) -> Route {
        Route {
            endpoint_id: e.to_owned(),
            subscription_id: format!("sub_{e}"),
            ordered: false,
        }
    }

    fn snapshot(filters: &[(&str, &str)]) -> Arc<Tables> {
        let mut t = Tables::default();
        for (f, e) in filters {
            t.filter(f);
            t.route(route(e));
        }
        Arc::new(t)
    }

    #[test]
    fn plans_of_one_snapshot_append_by_number_and_others_by_text() {
        let one = snapshot(&[("$.x > 1", "a"), ("$.y > 1", "b")]);
        let mut a = Filtered::new(one.clone());
        a.push_indexed(1, 1, 1);
        a.push(1, "($.x > 1) || ($.q > 1)", route("a"));
        let mut b = Filtered::new(one.clone());
        b.push_indexed(1, 2, 2);
        b.push(1, "($.x > 1) || ($.q > 1)", route("a"));
        // Another snapshot (the next second, or another key): same texts, other numbers.
        let other = snapshot(&[("$.z > 1", "c"), ("$.x > 1", "a")]);
        let mut c = Filtered::new(other);
        c.push_indexed(1, 1, 1);
        c.push_indexed(1, 2, 2);

        let mut all = Filtered::default();
        all.append(&a, 0);
        all.append(&b, 1);
        all.append(&c, 2);
        assert_eq!(all.events, [1, 1, 2, 2, 3, 3]);
        assert_eq!(all.filter_of, [1, 3, 2, 3, 4, 5]);
        let texts: Vec<&str> = (0..all.len()).map(|c| all.filter_text(c)).collect();
        assert_eq!(
            texts,
            [
                "$.x > 1",
                "($.x > 1) || ($.q > 1)",
                "$.y > 1",
                "($.x > 1) || ($.q > 1)",
                "$.z > 1",
                "$.x > 1"
            ]
        );
        assert_eq!(all.route_of_candidate(4), ("c", "sub_c", false));

        // The statement gets each text and route once, only those used, renumbered.
        let cols = all.columns();
        assert_eq!(
            cols.filters,
            [
                "$.x > 1",
                "($.x > 1) || ($.q > 1)",
                "$.y > 1",
                "$.z > 1",
                "$.x > 1"
            ]
        );
        assert_eq!(cols.filter_of, [1, 2, 3, 2, 4, 5]);
        // A route of the base met again in `extra` (joined filters, another snapshot) is
        // sent twice: harmless, and rare.
        assert_eq!(cols.route_endpoints, ["a", "a", "b", "c"]);
        assert_eq!(cols.route_of, [1, 2, 3, 2, 4, 2]);
    }

    fn sealed(n: usize, tag: &str) -> Arc<Tables> {
        let mut t = Tables::default();
        for i in 0..n {
            t.filter(&format!("$.x > {i}"));
            t.route(route(&format!("{tag}{i}")));
        }
        t.seal();
        Arc::new(t)
    }

    #[test]
    fn a_snapshot_is_named_by_the_digest_of_its_content() {
        let digest = |t: &Tables| t.sealed().expect("sealed").digest;
        assert_eq!(digest(&sealed(10, "a")), digest(&sealed(10, "a")));
        assert_ne!(digest(&sealed(10, "a")), digest(&sealed(10, "b")), "routes");
        assert_ne!(
            digest(&sealed(10, "a")),
            digest(&sealed(11, "a")),
            "filters"
        );
        let mut ordered = Tables::default();
        let mut unordered = Tables::default();
        for (t, o) in [(&mut ordered, true), (&mut unordered, false)] {
            t.filter("$.x > 1");
            t.route(Route {
                ordered: o,
                ..route("a")
            });
            t.seal();
        }
        assert_ne!(digest(&ordered), digest(&unordered), "ordered");
        // Length-prefixed: moving a character between two texts changes the digest.
        let mut one = Tables::default();
        one.route(Route {
            endpoint_id: "ab".into(),
            subscription_id: "c".into(),
            ordered: false,
        });
        one.seal();
        let mut two = Tables::default();
        two.route(Route {
            endpoint_id: "a".into(),
            subscription_id: "bc".into(),
            ordered: false,
        });
        two.seal();
        assert_ne!(digest(&one), digest(&two));
    }

    #[test]
    fn a_statement_names_the_stored_tables_when_it_uses_enough_of_them() {
        let base = sealed(16, "e");
        // All of them, and a joined filter the tables lack: kept numbers, the extra after.
        let mut all = Filtered::new(base.clone());
        for i in 1..=16 {
            all.push_indexed(1, i, i);
        }
        all.push(1, "($.x > 1) || ($.q > 1)", route("e1"));
        let cols = all.columns();
        assert!(cols.tables.is_some(), "named by digest");
        assert_eq!(
            cols.filters,
            ["($.x > 1) || ($.q > 1)"],
            "only what they lack"
        );
        assert_eq!(cols.route_endpoints, ["e1"]);
        assert_eq!(cols.filter_of, (1..=17).collect::<Vec<i32>>());
        assert_eq!(cols.route_of[16], 17);

        // Two of twenty-four: cheaper to parse those two than to read them all.
        let mut few = Filtered::new(sealed(24, "e"));
        few.push_indexed(1, 5, 5);
        few.push_indexed(2, 9, 9);
        let cols = few.columns();
        assert!(cols.tables.is_none(), "texts");
        assert_eq!(cols.filters, ["$.x > 4", "$.x > 8"]);
        assert_eq!(cols.filter_of, [1, 2]);

        // Below the floor, never by digest.
        let small = sealed(STORED_MIN_FILTERS - 1, "s");
        let mut plan = Filtered::new(small);
        for i in 1..STORED_MIN_FILTERS as i32 {
            plan.push_indexed(1, i, i);
        }
        assert!(plan.columns().tables.is_none());
    }

    #[test]
    fn plans_of_a_reloaded_snapshot_append_by_number() {
        // The sender cache reloads an unchanged snapshot: another Arc, the same digest.
        let (first, reloaded) = (sealed(10, "e"), sealed(10, "e"));
        assert!(!Arc::ptr_eq(&first, &reloaded));
        let mut a = Filtered::new(first);
        a.push_indexed(1, 3, 3);
        let mut b = Filtered::new(reloaded);
        b.push_indexed(1, 4, 4);
        let mut all = Filtered::default();
        all.append(&a, 0);
        all.append(&b, 1);
        assert_eq!(all.filter_of, [3, 4], "no text moved");
        assert!(all.extra.filters.is_empty());
    }
}
