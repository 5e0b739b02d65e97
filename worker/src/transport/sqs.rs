//! Amazon SQS as a transport: `SendMessage` over SQS's JSON protocol, signed with AWS
//! Signature Version 4 (the official `aws-sigv4` signer), through the same guarded HTTP
//! client as HTTP Attempts (so the SSRF guard is the client's resolver, as for HTTP). An
//! Attempt is delivered when SQS answers 200 with a `MessageId`.
//!
//! Why not the `aws-sdk-sqs` client: SQS's JSON protocol is one signed POST, and the SDK's
//! runtime would add its own HTTP stack and retry loop beside Railhook's (the ladders are
//! Railhook's, per endpoint). Measured: the signer and its few crates added ~70 s to a
//! clean debug build of the worker on the 2-core machine, with lapin and async-nats.
//!
//! A FIFO queue (`….fifo`) gets the endpoint's ordering key as `MessageGroupId` and the
//! Delivery id as `MessageDeduplicationId`, so a re-sent Attempt inside SQS's five-minute
//! window is dropped by SQS. The Standard Webhooks headers travel as message attributes
//! (SQS allows ten; custom headers beyond them are not carried).

use std::time::{Duration, SystemTime};

use aws_credential_types::Credentials;
use aws_sigv4::http_request::{SignableBody, SignableRequest, SigningSettings, sign};
use aws_sigv4::sign::v4;
use railhook_common::transport::SqsTarget;
use serde_json::{Value, json};

use super::http::Runner;
use super::{BrokerError, Stopwatch, ordering_key};
use crate::attempt::{Attempt, ErrorClass, Report};

/// SQS's limit on message attributes.
const MAX_ATTRIBUTES: usize = 10;

/// The attributes carried first, in this order, while there is room.
const FIRST: &[&str] = &[
    "webhook-id",
    "webhook-timestamp",
    "webhook-signature",
    "x-event-id",
    "x-event-type",
    "content-type",
];

#[derive(Clone)]
pub struct Queues {
    http: Runner,
}

impl Queues {
    pub fn new(http: Runner) -> Self {
        Self { http }
    }

    pub async fn send(&self, a: &Attempt, s: &SqsTarget) -> Report {
        let watch = Stopwatch::start();
        watch.report(self.send_message(a, s).await)
    }

    async fn send_message(&self, a: &Attempt, s: &SqsTarget) -> Result<String, BrokerError> {
        let endpoint = match &s.endpoint_url {
            Some(e) => e.trim_end_matches('/').to_owned(),
            None => format!("https://sqs.{}.amazonaws.com", s.region),
        };
        let url: url::Url = format!("{endpoint}/")
            .parse()
            .map_err(|_| BrokerError::refused("sqs: the endpoint URL does not parse"))?;
        if self.http.literal_refused(&url) {
            return Err(BrokerError::target_refused(
                "target address is not allowed (private, loopback or otherwise non-global)",
            ));
        }
        let body = serde_json::to_vec(&message(a, s)).unwrap_or_default();
        let headers = signed(s, url.as_str(), &body)?;
        let exchange = super::http::Exchange::post(url, headers, bytes::Bytes::from(body));
        let response = match tokio::time::timeout(a.timeout, self.http.way().send(exchange)).await {
            Err(_) => {
                return Err(BrokerError::unavailable(
                    "sqs: no answer within the timeout",
                ));
            }
            Ok(Err(class)) => {
                let mut error = BrokerError::unavailable(format!("sqs: {}", class.as_str()));
                if class == ErrorClass::TargetRefused {
                    error.class = class;
                }
                return Err(error);
            }
            Ok(Ok(r)) => r,
        };
        let status = response.status;
        let text = String::from_utf8_lossy(
            &response
                .read_body(1024 * 1024, Duration::from_secs(5))
                .await,
        )
        .into_owned();
        let answer: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        if status.is_success() {
            return match answer.get("MessageId").and_then(Value::as_str) {
                Some(id) => Ok(format!("sqs: MessageId {id}")),
                None => Err(BrokerError::unavailable(
                    "sqs: 200 without a MessageId (not counted as delivered)",
                )),
            };
        }
        Err(refusal(status.as_u16(), &answer))
    }
}

/// `SendMessage`'s request.
fn message(a: &Attempt, s: &SqsTarget) -> Value {
    let pairs = a.signed_headers(chrono::Utc::now().timestamp());
    let mut attributes = serde_json::Map::new();
    let ordered = FIRST
        .iter()
        .filter_map(|first| pairs.iter().find(|(n, _)| n.eq_ignore_ascii_case(first)))
        .chain(
            pairs
                .iter()
                .filter(|(n, _)| !FIRST.iter().any(|f| n.eq_ignore_ascii_case(f))),
        );
    for (name, value) in ordered.take(MAX_ATTRIBUTES) {
        attributes.insert(
            name.to_ascii_lowercase(),
            json!({"DataType": "String", "StringValue": value}),
        );
    }
    // SQS bodies are text: a forwarded webhook's raw body that is not UTF-8 goes as base64,
    // and says so.
    let body = match std::str::from_utf8(&a.body) {
        Ok(text) => text.to_owned(),
        Err(_) => {
            use base64::Engine;
            attributes.insert(
                "content-transfer-encoding".into(),
                json!({"DataType": "String", "StringValue": "base64"}),
            );
            base64::engine::general_purpose::STANDARD.encode(&a.body)
        }
    };
    let mut request = json!({
        "QueueUrl": s.queue_url,
        "MessageBody": body,
        "MessageAttributes": attributes,
    });
    if s.queue_url.ends_with(".fifo") {
        request["MessageGroupId"] = json!(ordering_key(a, "endpoint"));
        request["MessageDeduplicationId"] = json!(a.delivery_id);
    }
    request
}

/// The signed request's headers (SigV4 over the body).
fn signed(s: &SqsTarget, url: &str, body: &[u8]) -> Result<Vec<(String, String)>, BrokerError> {
    let plain = [
        ("content-type", "application/x-amz-json-1.0"),
        ("x-amz-target", "AmazonSQS.SendMessage"),
    ];
    let secret = s.secret_access_key.clone().unwrap_or_default();
    let identity = Credentials::new(&s.access_key_id, secret, None, None, "railhook").into();
    let params = v4::SigningParams::builder()
        .identity(&identity)
        .region(&s.region)
        .name("sqs")
        .time(SystemTime::now())
        .settings(SigningSettings::default())
        .build()
        .map_err(|e| BrokerError::refused(format!("sqs: cannot sign: {e}")))?
        .into();
    let signable = SignableRequest::new(
        "POST",
        url,
        plain.iter().copied(),
        SignableBody::Bytes(body),
    )
    .map_err(|e| BrokerError::refused(format!("sqs: cannot sign: {e}")))?;
    let (instructions, _) = sign(signable, &params)
        .map_err(|e| BrokerError::refused(format!("sqs: cannot sign: {e}")))?
        .into_parts();
    let mut headers: Vec<(String, String)> = plain
        .iter()
        .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
        .collect();
    headers.extend(
        instructions
            .headers()
            .map(|(n, v)| (n.to_owned(), v.to_owned())),
    );
    Ok(headers)
}

/// An SQS error answer in Railhook's words.
fn refusal(status: u16, answer: &Value) -> BrokerError {
    let kind = answer
        .get("__type")
        .and_then(Value::as_str)
        .unwrap_or("")
        .rsplit('#')
        .next()
        .unwrap_or("")
        .to_owned();
    let said = answer
        .get("message")
        .or_else(|| answer.get("Message"))
        .and_then(Value::as_str)
        .unwrap_or("");
    let message = format!("sqs: {status} {kind} {said}").trim().to_owned();
    if kind.contains("Throttl") || kind.contains("OverLimit") || status == 429 {
        BrokerError::throttled(message)
    } else if status >= 500 || kind.contains("ServiceUnavailable") || kind.contains("InternalError")
    {
        BrokerError::unavailable(message)
    } else {
        // Access refused, no such queue, bad parameters, a message too large: a person
        // must change something.
        BrokerError::refused(message)
    }
}
