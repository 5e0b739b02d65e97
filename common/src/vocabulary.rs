//! The product's closed sets of words: every noun that is stored, exported as a metric label
//! or sent to a receiver as text is an enum here (or in `status.rs`), so a word exists in
//! one place and a label set can never drift from the type it describes.
//!
//! Each enum derives strum's `VariantArray` (its `ALL`) and `IntoStaticStr` (its word); the
//! [`Word`] trait gives every one of them `as_str` and `parse`. Metric families are built
//! from `X::ALL` by [`crate::metrics_http::Family`], which also declares every label value at
//! start, so a dashboard shows zeros rather than gaps.

use strum::VariantArray;

/// A closed set of words: `ALL`, `as_str` and `parse` for every enum in this module.
pub trait Word: VariantArray + Copy + Into<&'static str> + 'static {
    /// Every value, in declaration order.
    const ALL: &'static [Self] = Self::VARIANTS;

    fn as_str(self) -> &'static str {
        self.into()
    }

    /// The value spelled `raw`; `None` for any other text.
    fn parse(raw: &str) -> Option<Self> {
        Self::VARIANTS.iter().copied().find(|v| v.as_str() == raw)
    }
}

impl<T: VariantArray + Copy + Into<&'static str> + 'static> Word for T {}

/// Declares a closed set of words (see the module doc); the words are snake_case unless a
/// variant says otherwise with `#[strum(serialize = "…")]`. A crate using it depends on
/// strum (the derives name it).
#[macro_export]
macro_rules! words {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(
            Debug, Clone, Copy, PartialEq, Eq, Hash, ::strum::VariantArray, ::strum::IntoStaticStr,
        )]
        #[strum(serialize_all = "snake_case")]
        pub enum $name { $($(#[$vmeta])* $variant),+ }

        impl ::std::fmt::Display for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str($crate::vocabulary::Word::as_str(*self))
            }
        }
    };
}

crate::words! {
    /// Which way a Delivery goes (`deliveries.direction`): an Event of the project's own to
    /// an endpoint, or a provider's webhook forwarded to a Source's Destination. The
    /// direction picks the retry ladder (`worker::retry_policy`).
    Direction { Outgoing, Incoming }
}

crate::words! {
    /// The worker's two hint lanes (`worker::lanes`): fresh Deliveries from the relay, and
    /// RetryHints from the retry publisher. Each has its own topic, permits and pause.
    Lane { Fresh, Retry }
}

crate::words! {
    /// What an endpoint is for (`endpoints.kind`): a project's webhook receiver, or an
    /// operational endpoint that hears about the project's own endpoints and failures.
    EndpointKind { Webhook, Operational }
}

crate::words! {
    /// What carries an endpoint's Attempts (`endpoints.transport`, the API's `type`): an
    /// HTTP request, a publish to a broker (common/src/transport/), or nothing at all for a
    /// `poller`, whose receiver reads its Deliveries (docs/POLLING.md), or a `listen` session's
    /// connection to a developer's laptop (docs/RECEIVERS.md, "railhook listen").
    #[derive(serde::Serialize, serde::Deserialize)]
    #[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
    #[serde(rename_all = "lowercase")]
    TransportKind { Http, Kafka, Sqs, Rabbitmq, Nats, Poller, Listen }
}

crate::words! {
    /// How a Delivery came to be (`deliveries.origin`): with its Event at ingest, or made
    /// again by a Replay (the Time Machine). An Idempotency-Key's answer lists only the
    /// first kind.
    DeliveryOrigin { Ingest, Replay }
}

crate::words! {
    /// Where a Replay stands (`replays.status`); the API shows the words in capitals.
    ReplayStatus {
        #[strum(serialize = "RUNNING")]
        Running,
        #[strum(serialize = "COMPLETED")]
        Completed,
        #[strum(serialize = "CANCELLED")]
        Cancelled,
    }
}

crate::words! {
    /// The customer portal's colour scheme (`portal_settings.color_scheme`): fixed light or
    /// dark, or the viewer's own preference.
    ColorScheme { Light, Dark, Auto }
}

crate::words! {
    /// An endpoint's circuit breaker (`endpoints.breaker_state`, the breaker metrics).
    BreakerState { Closed, Open, HalfOpen }
}

crate::words! {
    /// Why a claimed Delivery was put back without an Attempt (a Deferral).
    DeferralReason { Breaker, Throttled, Concurrency, Rate, Ordering }
}

crate::words! {
    /// What one Attempt's request came to, as `railhook_worker_attempt_duration_seconds`
    /// labels it: what the receiver did, or why nothing came back; `target_refused` when the
    /// SSRF guard kept the request from being sent (the endpoint's configuration, not
    /// Railhook's fault). Railhook's own failures are [`InternalError`]s instead, so a
    /// receiver's bad day and ours never share a series.
    AttemptResult {
        Success,
        #[strum(serialize = "http_4xx")]
        Http4xx,
        #[strum(serialize = "http_5xx")]
        Http5xx,
        HttpOther,
        Timeout,
        Connect,
        Reset,
        Request,
        TargetRefused,
        BrokerUnavailable,
        BrokerThrottled,
        BrokerRefused,
        #[strum(serialize = "oauth_token_unavailable")]
        OAuthTokenUnavailable,
        #[strum(serialize = "oauth_token_refused")]
        OAuthTokenRefused,
    }
}

crate::words! {
    /// Railhook's own failures on the delivery path: an Attempt's outcome that could not be
    /// written (Postgres away past the retries; the sweep hands the Delivery back), a
    /// Delivery deferred because no configured key opens its endpoint's secret, and a stored
    /// per-endpoint retry ladder that does not parse (the direction's ladder is used).
    InternalError { OutcomeNotWritten, SecretUnavailable, LadderOverrideInvalid }
}

crate::words! {
    /// Operational webhook types, in the names receivers of other services already parse
    /// (`ingest::operational`, and `fence::finalise` for Attempt outcomes).
    OperationalEvent {
        #[strum(serialize = "endpoint.created")]
        EndpointCreated,
        #[strum(serialize = "endpoint.updated")]
        EndpointUpdated,
        #[strum(serialize = "endpoint.deleted")]
        EndpointDeleted,
        #[strum(serialize = "endpoint.disabled")]
        EndpointDisabled,
        #[strum(serialize = "endpoint.enabled")]
        EndpointEnabled,
        #[strum(serialize = "message.attempt.failing")]
        AttemptFailing,
        #[strum(serialize = "message.attempt.exhausted")]
        AttemptExhausted,
        #[strum(serialize = "message.attempt.recovered")]
        AttemptRecovered,
        /// One audit-log row (docs/ACCESS.md); sent only to an endpoint that names it.
        #[strum(serialize = "audit.entry")]
        AuditEntry,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_round_trip_and_spell_what_is_stored() {
        assert_eq!(BreakerState::HalfOpen.as_str(), "half_open");
        assert_eq!(AttemptResult::Http4xx.as_str(), "http_4xx");
        assert_eq!(
            OperationalEvent::AttemptExhausted.as_str(),
            "message.attempt.exhausted"
        );
        assert_eq!(Direction::parse("incoming"), Some(Direction::Incoming));
        assert_eq!(Direction::parse("Incoming"), None);
        for word in OperationalEvent::ALL {
            assert_eq!(OperationalEvent::parse(word.as_str()), Some(*word));
        }
        assert_eq!(Lane::ALL, &[Lane::Fresh, Lane::Retry]);
    }
}
