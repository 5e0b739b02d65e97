//! Each transport kind's settings, checked at create and on a PATCH (docs/DESTINATIONS.md):
//! every check names the field it refuses (`kafka.brokers`).

use super::{
    Invalid, KAFKA_KEYS, KafkaTarget, NatsTarget, RabbitmqTarget, SqsTarget, host_port, invalid,
};

/// A name of `[A-Za-z0-9._-]`, 1 to `max` characters.
fn plain_name(raw: &str, max: usize) -> bool {
    crate::names::is_plain_name(raw, max)
}

pub(super) fn validate_kafka(k: &KafkaTarget) -> Result<(), Invalid> {
    if k.brokers.is_empty() || k.brokers.len() > 10 {
        return Err(invalid(
            "kafka.brokers",
            "kafka.brokers must list 1 to 10 brokers",
        ));
    }
    if let Some(bad) = k.brokers.iter().find(|b| host_port(b).is_none()) {
        return Err(invalid(
            "kafka.brokers",
            format!("kafka.brokers: '{bad}' is not host:port"),
        ));
    }
    if !plain_name(&k.topic, 249) || k.topic == "." || k.topic == ".." {
        return Err(invalid(
            "kafka.topic",
            "kafka.topic must be 1 to 249 of [A-Za-z0-9._-]",
        ));
    }
    let pointer = k.key.starts_with('/') && k.key.len() <= 256;
    if !(KAFKA_KEYS.contains(&k.key.as_str()) || pointer) {
        return Err(invalid(
            "kafka.key",
            "kafka.key must be endpoint, event_id, application or a JSON pointer (/a/b)",
        ));
    }
    let Some(s) = &k.security else {
        return Ok(());
    };
    if !matches!(
        s.protocol.as_str(),
        "plaintext" | "ssl" | "sasl_plaintext" | "sasl_ssl"
    ) {
        return Err(invalid(
            "kafka.security.protocol",
            "kafka.security.protocol must be plaintext, ssl, sasl_plaintext or sasl_ssl",
        ));
    }
    let sasl = s.protocol.starts_with("sasl_");
    match (&s.sasl_mechanism, sasl) {
        (Some(m), true) if matches!(m.as_str(), "PLAIN" | "SCRAM-SHA-256" | "SCRAM-SHA-512") => {}
        (_, true) => {
            return Err(invalid(
                "kafka.security.sasl_mechanism",
                "kafka.security.sasl_mechanism must be PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512",
            ));
        }
        (Some(_), false) => {
            return Err(invalid(
                "kafka.security.sasl_mechanism",
                "kafka.security.sasl_mechanism needs a sasl_ protocol",
            ));
        }
        (None, false) => {}
    }
    if sasl && (s.sasl_username.is_none() || s.sasl_password.is_none()) {
        return Err(invalid(
            "kafka.security.sasl_username",
            "a sasl_ protocol needs sasl_username and sasl_password",
        ));
    }
    if let Some(pem) = &s.ssl_ca_pem
        && (!pem.contains("-----BEGIN CERTIFICATE-----") || pem.len() > 65_536)
    {
        return Err(invalid(
            "kafka.security.ssl_ca_pem",
            "kafka.security.ssl_ca_pem must be PEM certificates (at most 64 KiB)",
        ));
    }
    Ok(())
}

fn http_url(raw: &str, field: &str) -> Result<url::Url, Invalid> {
    let url = url::Url::parse(raw)
        .ok()
        .filter(|u| matches!(u.scheme(), "http" | "https") && u.host_str().is_some())
        .filter(|u| u.username().is_empty() && u.password().is_none())
        .ok_or_else(|| invalid(field, format!("{field} must be an http(s) URL with a host")))?;
    Ok(url)
}

pub(super) fn validate_sqs(s: &SqsTarget) -> Result<(), Invalid> {
    let queue = http_url(&s.queue_url, "sqs.queue_url")?;
    let segments: Vec<&str> = queue.path().trim_matches('/').split('/').collect();
    if segments.len() != 2 || !plain_name(segments[1], 80) {
        return Err(invalid(
            "sqs.queue_url",
            "sqs.queue_url must end in /<account>/<queue name>",
        ));
    }
    if !(1..=32).contains(&s.region.len())
        || !s
            .region
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
    {
        return Err(invalid(
            "sqs.region",
            "sqs.region must be a region name (eu-west-1)",
        ));
    }
    if !(1..=128).contains(&s.access_key_id.len())
        || !s.access_key_id.chars().all(|c| c.is_ascii_alphanumeric())
    {
        return Err(invalid(
            "sqs.access_key_id",
            "sqs.access_key_id must be 1 to 128 letters and digits",
        ));
    }
    match &s.secret_access_key {
        Some(k) if (1..=256).contains(&k.len()) && !k.chars().any(char::is_whitespace) => {}
        _ => {
            return Err(invalid(
                "sqs.secret_access_key",
                "sqs.secret_access_key is required (1 to 256 characters, no spaces)",
            ));
        }
    }
    if let Some(e) = &s.endpoint_url {
        http_url(e, "sqs.endpoint_url")?;
    }
    Ok(())
}

fn broker_url(raw: &str, field: &str, schemes: &[&str]) -> Result<(), Invalid> {
    let ok = url::Url::parse(raw)
        .ok()
        .filter(|u| schemes.contains(&u.scheme()))
        .is_some_and(|u| u.host_str().is_some_and(|h| !h.is_empty()));
    if ok && raw.len() <= 2048 {
        Ok(())
    } else {
        Err(invalid(
            field,
            format!("{field} must be a {} URL with a host", schemes.join(" or ")),
        ))
    }
}

pub(super) fn validate_rabbitmq(r: &RabbitmqTarget) -> Result<(), Invalid> {
    broker_url(&r.url, "rabbitmq.url", &["amqp", "amqps"])?;
    if r.exchange.len() > 255 || (!r.exchange.is_empty() && !plain_name(&r.exchange, 255)) {
        return Err(invalid(
            "rabbitmq.exchange",
            "rabbitmq.exchange must be at most 255 of [A-Za-z0-9._-] (\"\": the default exchange)",
        ));
    }
    if r.routing_key.len() > 255 || r.routing_key.chars().any(char::is_control) {
        return Err(invalid(
            "rabbitmq.routing_key",
            "rabbitmq.routing_key must be at most 255 printable characters",
        ));
    }
    Ok(())
}

pub(super) fn validate_nats(n: &NatsTarget) -> Result<(), Invalid> {
    broker_url(&n.url, "nats.url", &["nats", "tls"])?;
    let tokens_ok = n.subject.len() <= 255
        && n.subject.split('.').all(|t| {
            !t.is_empty() && t != "*" && t != ">" && !t.chars().any(|c| c.is_whitespace())
        });
    if !tokens_ok {
        return Err(invalid(
            "nats.subject",
            "nats.subject must be dot-separated tokens without wildcards or spaces",
        ));
    }
    if !n.jetstream {
        return Err(invalid(
            "nats.jetstream",
            "nats.jetstream must be true: core NATS does not acknowledge a publish, and \
             Railhook never delivers fire-and-forget",
        ));
    }
    Ok(())
}
