//! The documentation's references against the code (issue #58): the REST API page is
//! rendered from the OpenAPI document a live server serves, and the settings and metrics
//! pages must name exactly what the code reads and exports. A new route, setting or metric
//! that is not documented fails here; `RAILHOOK_UPDATE_DOCS=1` rewrites the generated page.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;

use serde_json::Value;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// `writeln!` into a `String`, which cannot fail.
macro_rules! w {
    ($($arg:tt)*) => {
        let _ = writeln!($($arg)*);
    };
}
const API_PAGE: &str = "docs/reference/api.md";

/// One line of a table cell: no pipes or line breaks of its own.
fn cell(text: &str) -> String {
    text.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace('|', "\\|")
}

/// A schema's name from its `$ref`.
fn ref_name(reference: &str) -> &str {
    reference.rsplit('/').next().unwrap_or(reference)
}

/// The anchor mdbook and GitHub give a `### Name` heading.
fn anchor(name: &str) -> String {
    name.chars()
        .filter(|c| c.is_alphanumeric() || *c == '_' || *c == '-')
        .flat_map(char::to_lowercase)
        .collect()
}

/// A schema as a short type: a link for a named one, `[T]` for an array, `A or B`.
fn type_of(schema: &Value) -> String {
    if let Some(r) = schema.get("$ref").and_then(Value::as_str) {
        let name = ref_name(r);
        return format!("[`{name}`](#{})", anchor(name));
    }
    for key in ["oneOf", "anyOf", "allOf"] {
        if let Some(list) = schema.get(key).and_then(Value::as_array) {
            let parts: Vec<String> = list.iter().map(type_of).collect();
            return parts.join(if key == "allOf" { " and " } else { " or " });
        }
    }
    let types: Vec<String> = match schema.get("type") {
        Some(Value::String(t)) => vec![t.clone()],
        Some(Value::Array(ts)) => ts
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_owned)
            .collect(),
        _ => vec![],
    };
    let rendered: Vec<String> = types
        .iter()
        .map(|t| match t.as_str() {
            "array" => format!(
                "[{}]",
                schema.get("items").map_or("any".to_owned(), type_of)
            ),
            "string" => match schema.get("format").and_then(Value::as_str) {
                Some(f) => format!("string ({f})"),
                None => match schema.get("enum").and_then(Value::as_array) {
                    Some(values) => values
                        .iter()
                        .map(|v| format!("`{}`", v.as_str().unwrap_or_default()))
                        .collect::<Vec<_>>()
                        .join(", "),
                    None => "string".to_owned(),
                },
            },
            other => other.to_owned(),
        })
        .collect();
    if rendered.is_empty() {
        "any".to_owned()
    } else {
        rendered.join(" or ")
    }
}

/// What a status code means on every route, for responses the code does not describe.
fn meaning(status: &str) -> &'static str {
    match status {
        "200" => "OK",
        "201" => "Created",
        "202" => "Accepted: stored, the work goes on",
        "204" => "Done; no body",
        "400" => "The request could not be read",
        "401" => "No key, or a key Railhook does not know",
        "403" => "The key's role or scope does not allow this",
        "404" => "No such object in this project",
        "409" => "Conflicts with the object's state or an earlier request",
        "413" => "The body is over the size limit",
        "422" => "Invalid: `code` and `field` say what",
        "429" => "Over the quota or a rate limit",
        "503" => "A dependency is not answering; try again",
        _ => "",
    }
}

/// The body schema of a request body or response, with its media type.
fn body_of(content: Option<&Value>) -> String {
    let Some(content) = content.and_then(Value::as_object) else {
        return String::new();
    };
    content
        .iter()
        .map(|(media, v)| {
            let t = v.get("schema").map_or("any".to_owned(), type_of);
            format!("{t} (`{media}`)")
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// The reference page for `doc`: operations grouped by tag, then every schema.
fn render(doc: &Value) -> String {
    let mut out = String::new();
    let title = doc["info"]["title"].as_str().unwrap_or("Railhook");
    let version = doc["info"]["version"].as_str().unwrap_or("");
    w!(
        out,
        "# REST API reference\n\n<!-- Generated from the served /openapi.json by \
         tests/it/docs_reference.rs; do not edit. RAILHOOK_UPDATE_DOCS=1 rewrites it. -->\n\n\
         Every route of {title} {version} as `/openapi.json` serves it, grouped by resource, \
         then every schema. Conventions (authentication, errors, pagination, idempotency) and \
         the reasons behind each shape are in [REST API conventions and decisions](../API.md). \
         Every error is `application/problem+json` with a stable `code` \
         ([`Problem`](#problem)).\n"
    );
    let mut by_tag: BTreeMap<String, Vec<(String, String, &Value)>> = BTreeMap::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for (method, op) in item.as_object().expect("path item") {
            if !["get", "post", "put", "patch", "delete"].contains(&method.as_str()) {
                continue;
            }
            let tag = op["tags"][0].as_str().unwrap_or("other").to_owned();
            by_tag
                .entry(tag)
                .or_default()
                .push((path.clone(), method.to_uppercase(), op));
        }
    }
    w!(out, "## Routes\n");
    for (tag, ops) in &by_tag {
        w!(out, "### {tag}\n");
        for (path, method, op) in ops {
            w!(out, "#### `{method} {path}`\n");
            if let Some(s) = op["summary"].as_str() {
                w!(out, "{}\n", s.trim());
            }
            if let Some(d) = op["description"].as_str() {
                w!(out, "{}\n", d.trim());
            }
            let auth = op["security"]
                .as_array()
                .map(|s| {
                    s.iter()
                        .filter_map(Value::as_object)
                        .flat_map(|o| o.keys().cloned())
                        .collect::<Vec<_>>()
                })
                .unwrap_or_default();
            if !auth.is_empty() {
                w!(out, "Authentication: `{}`.\n", auth.join("` or `"));
            }
            if let Some(params) = op["parameters"].as_array().filter(|p| !p.is_empty()) {
                w!(
                    out,
                    "| parameter | in | required | type | description |\n| --- | --- | --- | --- | --- |"
                );
                for p in params {
                    w!(
                        out,
                        "| `{}` | {} | {} | {} | {} |",
                        p["name"].as_str().unwrap_or(""),
                        p["in"].as_str().unwrap_or(""),
                        if p["required"].as_bool() == Some(true) {
                            "yes"
                        } else {
                            "no"
                        },
                        cell(&p.get("schema").map_or("any".to_owned(), type_of)),
                        cell(p["description"].as_str().unwrap_or("")),
                    );
                }
                w!(out);
            }
            if let Some(body) = op.get("requestBody") {
                w!(out, "Request body: {}.\n", body_of(body.get("content")));
            }
            if let Some(responses) = op["responses"].as_object() {
                w!(out, "| answer | meaning | body |\n| --- | --- | --- |");
                for (status, r) in responses {
                    let said = r["description"].as_str().unwrap_or("").trim();
                    w!(
                        out,
                        "| {status} | {} | {} |",
                        cell(if said.is_empty() {
                            meaning(status)
                        } else {
                            said
                        }),
                        cell(&body_of(r.get("content")))
                    );
                }
                w!(out);
            }
        }
    }
    w!(out, "## Schemas\n");
    for (name, schema) in doc["components"]["schemas"].as_object().expect("schemas") {
        w!(out, "### {name}\n");
        if let Some(d) = schema["description"].as_str() {
            w!(out, "{}\n", d.trim());
        }
        let required: BTreeSet<&str> = schema["required"]
            .as_array()
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        match schema["properties"].as_object() {
            Some(props) if !props.is_empty() => {
                w!(
                    out,
                    "| field | type | required | description |\n| --- | --- | --- | --- |"
                );
                for (field, p) in props {
                    w!(
                        out,
                        "| `{field}` | {} | {} | {} |",
                        cell(&type_of(p)),
                        if required.contains(field.as_str()) {
                            "yes"
                        } else {
                            "no"
                        },
                        cell(p["description"].as_str().unwrap_or(""))
                    );
                }
                w!(out);
            }
            _ => {
                w!(out, "Type: {}.\n", cell(&type_of(schema)));
            }
        }
    }
    out.trim_end().to_owned() + "\n"
}

#[tokio::test]
async fn the_api_reference_is_rendered_from_the_served_openapi_document() {
    let server = crate::svix_sdk::server_with(&[]).await;
    let doc: Value = reqwest::get(format!("{}/openapi.json", server.all.api))
        .await
        .expect("openapi.json")
        .json()
        .await
        .expect("openapi body");
    let rendered = render(&doc);
    let path = format!("{ROOT}/{API_PAGE}");
    if std::env::var("RAILHOOK_UPDATE_DOCS").as_deref() == Ok("1") {
        std::fs::write(&path, &rendered).expect("write the reference");
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == rendered,
        "{API_PAGE} is not the served OpenAPI document's rendering: a route or schema changed. \
         Regenerate it with `RAILHOOK_UPDATE_DOCS=1 cargo test --test it -- docs_reference::` \
         and commit it"
    );
    let operations = doc["paths"]
        .as_object()
        .expect("paths")
        .values()
        .map(|item| item.as_object().map_or(0, |o| o.len()))
        .sum::<usize>();
    assert!(operations > 50, "{operations} operations rendered");
}

/// The setting names a `| `NAME` |` first cell of docs/CONFIGURATION.md's tables lists
/// (several names may share a row).
fn documented_settings() -> BTreeSet<String> {
    let doc = std::fs::read_to_string(format!("{ROOT}/docs/CONFIGURATION.md")).expect("doc");
    let mut names = BTreeSet::new();
    for line in doc.lines() {
        let Some(first) = line.strip_prefix("| ").and_then(|l| l.split(" | ").next()) else {
            continue;
        };
        for part in first.split('`').skip(1).step_by(2) {
            let name = part.trim_start_matches("RAILHOOK_");
            if !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
            {
                names.insert(name.to_owned());
            }
        }
    }
    names
}

#[test]
fn every_setting_the_code_reads_is_documented_and_every_documented_one_exists() {
    let fields =
        serde_aux::serde_introspection::serde_introspect::<railhook_common::config::Settings>();
    let code: BTreeSet<String> = fields.iter().map(|f| f.to_uppercase()).collect();
    assert!(code.len() > 50, "{} settings read", code.len());
    same_names(
        &code,
        &documented_settings(),
        "settings",
        "docs/CONFIGURATION.md",
    );
}

#[test]
fn every_exported_metric_is_in_the_catalogue_and_nothing_else_is() {
    let doc = std::fs::read_to_string(format!("{ROOT}/docs/METRICS.md")).expect("doc");
    let documented: BTreeSet<String> = doc
        .lines()
        .filter_map(|l| l.strip_prefix("| `railhook_"))
        .filter_map(|l| l.split('`').next())
        .map(|n| format!("railhook_{n}"))
        .collect();
    same_names(
        &crate::observability::exported(),
        &documented,
        "metrics",
        "docs/METRICS.md",
    );
}

/// A reference page names exactly what the code has: nothing left out, nothing extra.
fn same_names(code: &BTreeSet<String>, page: &BTreeSet<String>, what: &str, doc: &str) {
    let undocumented: Vec<_> = code.difference(page).collect();
    assert!(
        undocumented.is_empty(),
        "{what} the code has that {doc} has no row for: {undocumented:?}"
    );
    let unknown: Vec<_> = page.difference(code).collect();
    assert!(
        unknown.is_empty(),
        "{doc} lists {what} the code does not have: {unknown:?}"
    );
}
