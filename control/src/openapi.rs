//! What the OpenAPI document promises beyond the handlers' own attributes:
//! the security schemes, each operation's security requirement from the
//! access table ([`crate::api::ROUTES`]), and every refusal an operation
//! can answer with (auth, malformed input, the server's own failure), so a
//! client generated from the document needs nothing else.

use utoipa::openapi::path::{Operation, PathItem};
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityRequirement, SecurityScheme};
use utoipa::openapi::{ContentBuilder, Ref, RefOr, ResponseBuilder};

use crate::api::{access_of, Access};

/// Adds the contract to the generated document.
pub struct Contract;

/// Names of the security schemes.
pub const BEARER_SCHEME: &str = "bearer";
pub const MTLS_SCHEME: &str = "mtls";

impl utoipa::Modify for Contract {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        let components = doc.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            BEARER_SCHEME,
            SecurityScheme::Http(
                Http::builder()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "An operator token (`--admin-tokens`, `DATA_DIR/admin.token`) or, for one dataset's \
                 record, chunks and index, the token of a grant of it.",
                    ))
                    .build(),
            ),
        );
        components.add_security_scheme(
            MTLS_SCHEME,
            SecurityScheme::MutualTls {
                description: Some("A client certificate whose CN is in the node's `operator_cert_names`.".into()),
                extensions: None,
            },
        );
        for (path, item) in doc.paths.paths.iter_mut() {
            for (method, operation) in operations(item) {
                let access = access_of(method, path);
                describe(operation, access, path.contains('{'));
            }
        }
    }
}

fn operations(item: &mut PathItem) -> Vec<(&'static str, &mut Operation)> {
    let mut out = Vec::new();
    for (method, operation) in [
        ("GET", item.get.as_mut()),
        ("PUT", item.put.as_mut()),
        ("POST", item.post.as_mut()),
        ("DELETE", item.delete.as_mut()),
    ] {
        if let Some(operation) = operation {
            out.push((method, operation));
        }
    }
    out
}

fn error_response(description: &str) -> RefOr<utoipa::openapi::Response> {
    RefOr::T(
        ResponseBuilder::new()
            .description(description)
            .content(
                "application/json",
                ContentBuilder::new().schema(Some(Ref::from_schema_name("ApiErrorBody"))).build(),
            )
            .build(),
    )
}

fn describe(operation: &mut Operation, access: Option<Access>, has_path_params: bool) {
    let responses = &mut operation.responses.responses;
    let mut add = |status: &str, description: &str| {
        responses.entry(status.to_string()).or_insert_with(|| error_response(description));
    };
    add("500", "The node failed (internal)");
    let guarded = !matches!(access, Some(Access::Public));
    if guarded {
        add("401", "No credential, or one that does not authenticate (unauthenticated)");
        add("403", "A valid credential that may not make this call (forbidden)");
    }
    let has_query = operation
        .parameters
        .as_ref()
        .is_some_and(|p| p.iter().any(|p| matches!(p.parameter_in, utoipa::openapi::path::ParameterIn::Query)));
    if has_path_params || has_query {
        add("400", "A path or query parameter that does not parse (bad_request)");
    }
    if let Some(body) = &operation.request_body {
        add("400", "A request that does not parse (bad_request)");
        add("413", "A body over the operation's limit (too_large)");
        if body.content.contains_key("application/json") {
            add("415", "A body that is not application/json (unsupported_media_type)");
            add("422", "JSON that does not fit the schema (invalid_body)");
        }
    }
    operation.security = Some(match access {
        Some(Access::Public) => vec![SecurityRequirement::default()],
        Some(_) => vec![
            SecurityRequirement::new(BEARER_SCHEME, Vec::<String>::new()),
            SecurityRequirement::new(MTLS_SCHEME, Vec::<String>::new()),
        ],
        // Not in the access table: the node refuses it; say nothing opens it.
        None => Vec::new(),
    });
}

#[cfg(test)]
mod tests {
    use serde_json::Value;
    use utoipa::OpenApi as _;

    use crate::api::{ApiDoc, ROUTES};

    fn document() -> Value {
        serde_json::to_value(ApiDoc::openapi()).expect("document as JSON")
    }

    /// Every `$ref` in the document names something the document holds.
    #[test]
    fn every_ref_resolves() {
        fn walk(value: &Value, doc: &Value, seen: &mut usize) {
            match value {
                Value::Object(map) => {
                    if let Some(Value::String(target)) = map.get("$ref") {
                        let pointer = target.strip_prefix('#').expect("local ref");
                        assert!(doc.pointer(pointer).is_some(), "$ref {target} does not resolve");
                        *seen += 1;
                    }
                    map.values().for_each(|v| walk(v, doc, seen));
                }
                Value::Array(items) => items.iter().for_each(|v| walk(v, doc, seen)),
                _ => {}
            }
        }
        let doc = document();
        let mut seen = 0;
        walk(&doc, &doc, &mut seen);
        assert!(seen > 20, "only {seen} refs");
    }

    /// The access table and the document name the same operations, and
    /// every guarded one documents its refusals and security.
    #[test]
    fn access_table_covers_the_document() {
        let doc = document();
        let paths = doc["paths"].as_object().expect("paths");
        let mut documented = 0;
        for (path, item) in paths {
            for (method, operation) in item.as_object().expect("item") {
                let method = method.to_uppercase();
                let entry = ROUTES.iter().find(|(m, p, _)| *m == method && p == path);
                let (_, _, access) = entry.unwrap_or_else(|| panic!("{method} {path} is not in the access table"));
                documented += 1;
                let responses = operation["responses"].as_object().expect("responses");
                assert!(responses.contains_key("500"), "{method} {path}");
                let security = operation["security"].as_array().expect("security");
                if *access == crate::api::Access::Public {
                    assert!(!responses.contains_key("401"), "{method} {path} is public");
                } else {
                    assert!(responses.contains_key("401") && responses.contains_key("403"), "{method} {path}");
                    assert!(security.iter().any(|s| s.get("bearer").is_some()), "{method} {path}");
                }
                if operation["requestBody"]["content"].get("application/json").is_some() {
                    for status in ["400", "415", "422"] {
                        assert!(responses.contains_key(status), "{method} {path} lacks {status}");
                    }
                }
            }
        }
        assert_eq!(documented, ROUTES.len(), "every table entry is documented");
    }

    /// Request schemas say what the server enforces: closed objects, enums
    /// for kinds, patterns and lengths for names.
    #[test]
    fn request_schemas_are_closed_and_constrained() {
        let doc = document();
        let schemas = &doc["components"]["schemas"];
        for name in ["CreateRequest", "GrantRequest"] {
            assert_eq!(schemas[name]["additionalProperties"], Value::Bool(false), "{name}");
        }
        assert!(schemas["CreateRequest"]["properties"]["name"]["pattern"].is_string());
        assert!(schemas["GrantRequest"]["properties"]["client"]["maxLength"].is_number());
        let kind = &schemas["DatasetKind"];
        let text = kind.to_string();
        for variant in ["bytes", "tokens:u16", "tokens:u32", "records", "wds", "mds"] {
            assert!(text.contains(variant), "DatasetKind lists {variant}: {text}");
        }
        assert!(doc["components"]["securitySchemes"]["mtls"]["type"] == "mutualTLS");
    }
}
