//! Logging and tracing set-up shared by every role: text or JSON logs on stderr, and, when
//! `RAILHOOK_OTLP_ENDPOINT` is set, the same spans exported over OTLP/HTTP (protobuf) to a
//! collector (OpenTelemetry Collector, Tempo, Jaeger, Honeycomb…).

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{SpanExporter, WithExportConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

use crate::config::LogFormat;

/// Keeps the OTLP exporter alive; dropping it flushes the spans still batched. Drop it
/// outside the async runtime (the exporter's HTTP client is a blocking one).
#[must_use]
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        if let Some(provider) = self.provider.take()
            && let Err(e) = provider.shutdown()
        {
            eprintln!("warning: flushing OTLP spans failed: {e}");
        }
    }
}

/// The collector's trace URL: a base (`http://collector:4318`) gets the OTLP/HTTP path.
fn traces_url(endpoint: &str) -> String {
    let base = endpoint.trim_end_matches('/');
    if base.ends_with("/v1/traces") {
        base.to_owned()
    } else {
        format!("{base}/v1/traces")
    }
}

/// Installs the global subscriber (`RUST_LOG` overrides the default `info` level) and,
/// with an endpoint, the OTLP layer, whose spans carry `service.name = service`. Call it
/// before the async runtime starts.
pub fn init(format: LogFormat, otlp_endpoint: Option<&str>, service: &str) -> Telemetry {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let provider = otlp_endpoint.and_then(|endpoint| {
        let exporter = SpanExporter::builder()
            .with_http()
            .with_endpoint(traces_url(endpoint))
            .build();
        match exporter {
            Ok(exporter) => Some(
                SdkTracerProvider::builder()
                    .with_batch_exporter(exporter)
                    .with_resource(
                        Resource::builder()
                            .with_service_name(service.to_owned())
                            .build(),
                    )
                    .build(),
            ),
            Err(e) => {
                eprintln!("warning: OTLP export disabled: {e}");
                None
            }
        }
    });
    let otel = provider
        .as_ref()
        .map(|p| tracing_opentelemetry::layer().with_tracer(p.tracer("railhook")));
    let registry = tracing_subscriber::registry().with(filter).with(otel);
    let _ = match format {
        LogFormat::Json => registry
            .with(tracing_subscriber::fmt::layer().json())
            .try_init(),
        LogFormat::Text => registry.with(tracing_subscriber::fmt::layer()).try_init(),
    };
    Telemetry { provider }
}

#[cfg(test)]
mod tests {
    use super::traces_url;

    #[test]
    fn a_base_endpoint_gets_the_traces_path_once() {
        assert_eq!(traces_url("http://c:4318"), "http://c:4318/v1/traces");
        assert_eq!(traces_url("http://c:4318/"), "http://c:4318/v1/traces");
        assert_eq!(
            traces_url("http://c:4318/v1/traces"),
            "http://c:4318/v1/traces"
        );
    }
}
