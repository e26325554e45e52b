//! OpenAI-style error objects: `{"error": {"message", "type", "param", "code"}}` with an HTTP status.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

/// An error answered to a client.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// `invalid_request_error`, `not_found_error`, `rate_limit_error`, `timeout_error`,
    /// `server_error`.
    pub kind: &'static str,
    /// The request field at fault, when there is one.
    pub param: Option<String>,
    /// A short machine-readable code.
    pub code: Option<&'static str>,
}

impl ApiError {
    /// A 400 naming the field.
    pub fn field(param: &str, message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            message: format!("`{param}`: {}", message.into()),
            kind: "invalid_request_error",
            param: Some(param.to_string()),
            code: Some("invalid_value"),
        }
    }

    /// A 400 about the request as a whole (malformed JSON, not an object).
    pub fn request(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: None,
            code: Some("invalid_request"),
        }
    }

    pub fn with_code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    pub fn status(mut self, status: StatusCode) -> Self {
        self.status = status;
        self
    }

    pub fn server(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: message.into(),
            kind: "server_error",
            param: None,
            code: None,
        }
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::NOT_FOUND,
            message: message.into(),
            kind: "not_found_error",
            param: None,
            code: Some("not_found"),
        }
    }

    pub fn overloaded(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::TOO_MANY_REQUESTS,
            message: message.into(),
            kind: "rate_limit_error",
            param: None,
            code: Some("queue_full"),
        }
    }

    pub fn timeout(secs: f64) -> Self {
        Self {
            status: StatusCode::GATEWAY_TIMEOUT,
            message: format!(
                "the request did not finish within the server's per-request timeout of {secs} s \
                 (--timeout); its sequence was cancelled"
            ),
            kind: "timeout_error",
            param: None,
            code: Some("timeout"),
        }
    }

    /// The JSON object.
    pub fn body(&self) -> serde_json::Value {
        serde_json::json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        })
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, axum::Json(self.body())).into_response()
    }
}
