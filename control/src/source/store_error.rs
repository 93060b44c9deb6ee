//! An object store's error in words an operator reads at a glance.
//!
//! `object_store` puts the whole body of a store's error answer into its
//! error's text: S3, GCS's XML API and Azure answer with an XML document
//! (`<Error><Code>NoSuchBucket</Code><Message>…</Message><RequestId>…`),
//! GCS's JSON API with `{"error": {"message": …}}`. That text reaches
//! `sluicectl`, the log, `dataset stat`'s last error and the cache's
//! status, where half a kilobyte of XML hides the two words that matter.
//! Here the body becomes its code and message (and the request id, which
//! the store's support asks for), and the whole text is bounded, whatever
//! a store, or a proxy answering for it with an HTML page, sends.

use quick_xml::events::Event;
use quick_xml::Reader;

/// The most characters of an error's text kept: the store's own words fit
/// well within it; a body this describer does not know is cut.
const ERROR_TEXT_MAX_CHARS: usize = 600;

/// `err`'s text with the body of the store's answer reduced to its code
/// and message, at most [`ERROR_TEXT_MAX_CHARS`] characters.
pub(super) fn describe(err: &object_store::Error) -> String {
    tidy(&err.to_string())
}

/// [`describe`] for the text of an error. An answer with no body (a
/// HEAD's) leaves the text ending in the colon before it, which goes.
fn tidy(text: &str) -> String {
    let summarized = match body_start(text) {
        Some(at) => match summary(&text[at..]) {
            Some(summary) => format!("{}{summary}", &text[..at]),
            None => text.to_string(),
        },
        None => text.trim_end().trim_end_matches(':').to_string(),
    };
    bounded(summarized)
}

/// Where a store's answer body starts in an error's text: the first XML
/// declaration or element named `Error…` or `error…` (fake-gcs-server's
/// `<errorResponse>` holds an `<Error>`), or a JSON `{"error"` object.
fn body_start(text: &str) -> Option<usize> {
    ["<?xml", "<Error", "<error", "{\"error\""].iter().filter_map(|start| text.find(start)).min()
}

/// The code, message, details and request id a store's error body gives;
/// `None` where it gives neither a code nor a message.
fn summary(body: &str) -> Option<String> {
    let fields = if body.starts_with('{') { json_fields(body) } else { xml_fields(body) };
    let ErrorFields { code, message, details, request_id } = fields?;
    let mut summary = match (code, message) {
        (Some(code), Some(message)) => format!("{code}: {message}"),
        (Some(only), None) | (None, Some(only)) => only,
        (None, None) => return None,
    };
    for (before, part) in [(" (", details), (" (request id ", request_id)] {
        if let Some(part) = part {
            summary.extend([before, &part, ")"]);
        }
    }
    Some(summary)
}

#[derive(Default)]
struct ErrorFields {
    code: Option<String>,
    message: Option<String>,
    details: Option<String>,
    request_id: Option<String>,
}

/// The fields of an XML error document (`<Error><Code>…`), entities
/// resolved and white space (Azure's messages hold line breaks) made one
/// space; `None` where the body is not XML that reads.
fn xml_fields(body: &str) -> Option<ErrorFields> {
    let mut reader = Reader::from_str(body);
    let mut fields = ErrorFields::default();
    loop {
        match reader.read_event().ok()? {
            Event::Start(start) => {
                let name = start.name();
                let field = match name.as_ref() {
                    b"Code" => &mut fields.code,
                    b"Message" => &mut fields.message,
                    b"Details" | b"AuthenticationErrorDetail" => &mut fields.details,
                    b"RequestId" => &mut fields.request_id,
                    _ => continue,
                };
                let raw = reader.read_text(name).ok()?;
                let text = quick_xml::escape::unescape(&raw.decode().ok()?).ok()?.into_owned();
                *field = Some(one_line(&text)).filter(|text| !text.is_empty());
            }
            // What follows the error element (a wrapper's end) says nothing.
            Event::End(end) if end.name().as_ref() == b"Error" => return Some(fields),
            Event::Eof => return Some(fields),
            _ => {}
        }
    }
}

/// The fields of a JSON error (`{"error": {"code": 403, "message": …,
/// "errors": [{"reason": "forbidden"}]}}`, as Google's JSON APIs answer);
/// `None` where the body is not that.
fn json_fields(body: &str) -> Option<ErrorFields> {
    // The body may be followed by words of the error's own.
    let value = serde_json::Deserializer::from_str(body).into_iter::<serde_json::Value>().next()?.ok()?;
    let error = value.get("error")?;
    let text = |at: Option<&serde_json::Value>| at.and_then(serde_json::Value::as_str).map(one_line);
    // The numeric `code` repeats the HTTP status; the reason names it.
    let reason = error.get("errors").and_then(|errors| errors.get(0)).and_then(|first| first.get("reason"));
    Some(ErrorFields {
        code: text(error.get("status")).or_else(|| text(reason)),
        message: text(error.get("message")),
        details: None,
        request_id: None,
    })
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// `text` cut to [`ERROR_TEXT_MAX_CHARS`] characters, saying how much
/// was cut.
fn bounded(text: String) -> String {
    let Some((cut, _)) = text.char_indices().nth(ERROR_TEXT_MAX_CHARS) else {
        return text;
    };
    format!("{}… ({} more bytes)", &text[..cut], text.len() - cut)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_s3_error_body_becomes_its_code_message_and_request_id() {
        let text = "Generic S3 error: Error performing list request: Error performing GET \
                    http://127.0.0.1:5999/nobucket?list-type=2 in 2.7ms - Server returned non-2xx status code: \
                    404 Not Found: <?xml version=\"1.0\" encoding=\"utf-8\"?>\n<Error><Code>NoSuchBucket</Code>\
                    <Message>The specified bucket does not exist</Message><BucketName>nobucket</BucketName>\
                    <RequestId>BbErhW4rNpQ</RequestId><HostId>9Gjjt1m+cjU4OPvX9O9/8R=</HostId></Error>";
        assert_eq!(
            tidy(text),
            "Generic S3 error: Error performing list request: Error performing GET \
             http://127.0.0.1:5999/nobucket?list-type=2 in 2.7ms - Server returned non-2xx status code: \
             404 Not Found: NoSuchBucket: The specified bucket does not exist (request id BbErhW4rNpQ)"
        );
    }

    #[test]
    fn azure_and_gcs_bodies_read_as_one_line_with_entities_resolved() {
        let azure = "403 Forbidden: <?xml version=\"1.0\" encoding=\"utf-8\"?><Error>\
                     <Code>AuthenticationFailed</Code><Message>Server failed to authenticate the request.\n\
                     RequestId:8a1f\nTime:2026-12-08T00:00:00Z</Message><AuthenticationErrorDetail>Signature \
                     did not match</AuthenticationErrorDetail></Error>";
        assert_eq!(
            tidy(azure),
            "403 Forbidden: AuthenticationFailed: Server failed to authenticate the request. RequestId:8a1f \
             Time:2026-12-08T00:00:00Z (Signature did not match)"
        );
        let gcs_xml = "404 Not Found: <?xml version='1.0' encoding='UTF-8'?><Error><Code>NoSuchKey</Code>\
                       <Message>The key &apos;a&amp;b&apos; does not exist.</Message><Details>No such object: \
                       b/a&amp;b</Details></Error>";
        assert_eq!(tidy(gcs_xml), "404 Not Found: NoSuchKey: The key 'a&b' does not exist. (No such object: b/a&b)");
        let gcs_json = "403 Forbidden: {\"error\": {\"code\": 403, \"message\": \"caller does not have \
                        storage.objects.list access\", \"errors\": [{\"reason\": \"forbidden\"}]}}";
        let fake_gcs = "500 Internal Server Error: <errorResponse><Error><Code>500</Code><Message>no bucket \
                        named nothere</Message></Error></errorResponse>";
        assert_eq!(tidy(fake_gcs), "500 Internal Server Error: 500: no bucket named nothere");
        assert_eq!(tidy(gcs_json), "403 Forbidden: forbidden: caller does not have storage.objects.list access");
    }

    #[test]
    fn text_without_a_known_body_is_kept_and_every_text_is_bounded() {
        let plain = "Object at location key not found: Server returned non-2xx status code: 404 Not Found: ";
        assert_eq!(tidy(plain), plain.trim_end_matches(": "), "the colon of a body that is not there goes");
        let unreadable = "500: <Error><Code>Oops</Code><Message>cut sh";
        assert_eq!(tidy(unreadable), unreadable, "XML that does not read is kept as it came");

        // 23 characters of one byte, then 2 000 of two and 7 of one: 600
        // kept are 1 177 bytes of 4 030.
        let page = format!("502 Bad Gateway: <html>{}</html>", "é".repeat(2000));
        let bounded = tidy(&page);
        let (kept, said) = bounded.split_once('…').expect("a cut text says so");
        assert_eq!((kept.chars().count(), kept.len(), said), (ERROR_TEXT_MAX_CHARS, 1177, " (2853 more bytes)"));
        assert!(kept.starts_with("502 Bad Gateway: <html>é"));
        let long_message = format!("<Error><Code>X</Code><Message>{}</Message></Error>", "m ".repeat(1000));
        assert!(tidy(&long_message).chars().count() < ERROR_TEXT_MAX_CHARS + 30);
    }
}
