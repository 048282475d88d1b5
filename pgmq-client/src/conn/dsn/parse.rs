//! The crate's one DSN parser, with libpq's rules (`PQconninfoParse`), and
//! the rendering of a parsed DSN back to text with its password hidden.

use std::fmt;

/// Every connection keyword libpq knows (libpq 18's list: a DSN may use the
/// keywords of any libpq up to that one).
pub(crate) const KEYWORDS: &[&str] = &[
    "service",
    "user",
    "password",
    "passfile",
    "channel_binding",
    "connect_timeout",
    "dbname",
    "host",
    "hostaddr",
    "port",
    "client_encoding",
    "options",
    "application_name",
    "fallback_application_name",
    "keepalives",
    "keepalives_idle",
    "keepalives_interval",
    "keepalives_count",
    "tcp_user_timeout",
    "sslmode",
    "sslnegotiation",
    "sslcompression",
    "sslcert",
    "sslkey",
    "sslcertmode",
    "sslpassword",
    "sslrootcert",
    "sslcrl",
    "sslcrldir",
    "sslsni",
    "sslkeylogfile",
    "requirepeer",
    "require_auth",
    "min_protocol_version",
    "max_protocol_version",
    "ssl_min_protocol_version",
    "ssl_max_protocol_version",
    "gssencmode",
    "krbsrvname",
    "gsslib",
    "gssdelegation",
    "replication",
    "target_session_attrs",
    "load_balance_hosts",
    "scram_client_key",
    "scram_server_key",
    "oauth_issuer",
    "oauth_client_id",
    "oauth_client_secret",
    "oauth_scope",
];

/// Why a DSN could not be used. No variant holds a value of the DSN (a
/// malformed DSN can put a password where a keyword or a port belongs):
/// only byte offsets into it and the names of known keywords.
///
/// ```
/// use pgmq_client::{ConnInfo, DsnError};
/// let err = ConnInfo::parse("postgres://app:s3cret@db/app?application_name=%zz").unwrap_err();
/// assert!(matches!(err, DsnError::Syntax { at: 46, .. }));
/// assert!(!err.to_string().contains("s3cret"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DsnError {
    /// The text does not follow libpq's syntax at byte `at`.
    #[error("malformed DSN at byte {at}: {reason}")]
    Syntax {
        /// Byte offset into the DSN.
        at: usize,
        /// What is wrong there.
        reason: &'static str,
    },
    /// A keyword libpq does not know starts at byte `at` (not shown: it may
    /// be part of a password).
    #[error("unknown connection keyword at byte {at} of the DSN")]
    UnknownKeyword {
        /// Byte offset into the DSN.
        at: usize,
    },
    /// A keyword's value is not one libpq accepts.
    #[error("invalid DSN value for `{keyword}`: {reason}")]
    InvalidValue {
        /// The keyword.
        keyword: &'static str,
        /// Why (never the value).
        reason: String,
    },
    /// A keyword libpq knows but this crate cannot honour.
    #[error("DSN keyword `{keyword}` is not supported by pgmq-client: {reason}")]
    Unsupported {
        /// The keyword.
        keyword: &'static str,
        /// Why, and what to do instead.
        reason: &'static str,
    },
}

/// What [`ConnInfo::redacted`] (and [`redact_dsn`](crate::redact_dsn))
/// show for a URL with a `/` before the `@` of what looks like its user
/// information: libpq finds no user information there, so a password with
/// a raw `/` would be shown as host, port and database name.
pub const RAW_CREDENTIALS: &str =
    "<DSN not shown: a '/' before its '@' (in a password, write it as %2F)>";

/// A DSN parsed as libpq parses it: the keywords it sets and their values,
/// percent-escapes and quoting undone, in either form.
///
/// - URL: `postgres[ql]://[user[:password]@][host][:port][,...][/dbname][?key=value&...]`
///   (the scheme in lower case, as libpq requires). The user information
///   ends at the first `@` before any `/`; a host list separates its
///   `host:port` pairs with commas, IPv6 addresses in brackets; every part
///   is percent-decoded (an invalid escape or `%00` is an error). Query keys
///   must be libpq keywords (`ssl=true` means `sslmode=require`).
/// - key=value: `key=value` pairs separated by whitespace, a value quoted
///   with `'...'` when it holds whitespace, a backslash escaping the next
///   character (quoted or not). Unknown keywords are errors.
///
/// A keyword given twice keeps its last value. Lists (`host`, `hostaddr`,
/// `port`) stay comma-separated strings here, as libpq keeps them; the
/// values are checked when a connection is configured from them.
///
/// Where it differs from libpq: a DSN holding a NUL byte is refused (libpq
/// stops reading at it), and so is one whose percent-escapes decode to a
/// value that is not UTF-8 (libpq passes the bytes on). `Debug` and
/// [`redacted`](Self::redacted) never show the password.
///
/// ```
/// use pgmq_client::ConnInfo;
/// let info = ConnInfo::parse("postgres://app:pa%3Fss@db1:5432,db2/app?sslmode=require")?;
/// assert_eq!(info.get("password"), Some("pa?ss"));
/// assert_eq!(info.get("host"), Some("db1,db2"));
/// assert_eq!(info.get("sslmode"), Some("require"));
/// assert_eq!(info.redacted(), "postgres://app:***@db1:5432,db2/app?sslmode=require");
/// let kv = ConnInfo::parse(r"host=db user=app password='it\'s me'")?;
/// assert_eq!(kv.get("password"), Some("it's me"));
/// assert_eq!(kv.redacted(), "host=db user=app password=***");
/// # Ok::<(), pgmq_client::DsnError>(())
/// ```
#[derive(Clone)]
pub struct ConnInfo {
    /// The URL scheme (with `://`) for the URL form.
    url: Option<&'static str>,
    params: Vec<(&'static str, String)>,
    /// A URL whose user information libpq did not find because a `/` came
    /// before its `@` (`postgres://app:pa/ss@db/app`): libpq reads
    /// `app:pa` as host and port and the rest as the database name, so a
    /// password with a raw `/` would be shown as those fields. Such a DSN
    /// is never rendered redacted (see [`ConnInfo::redacted`]).
    raw_credentials: bool,
}

impl PartialEq for ConnInfo {
    /// Same form and same keyword values, in any order.
    fn eq(&self, other: &ConnInfo) -> bool {
        let sorted = |c: &ConnInfo| {
            let mut p = c.params.clone();
            p.sort();
            p
        };
        self.url.is_some() == other.url.is_some() && sorted(self) == sorted(other)
    }
}

impl Eq for ConnInfo {}

impl fmt::Debug for ConnInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("ConnInfo").field(&self.redacted()).finish()
    }
}

/// C's `isspace` in the C locale, which libpq's key=value parser uses.
fn is_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\x0b' | b'\x0c' | b'\r')
}

fn parse_keyword(name: &str) -> Option<&'static str> {
    KEYWORDS.iter().find(|k| **k == name).copied()
}

/// Undoes percent-escapes as libpq does: `%` must be followed by two hex
/// digits, and `%00` is refused. `at` is the offset of `s` in the DSN.
fn decode(s: &str, at: usize) -> Result<Vec<u8>, DsnError> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] != b'%' {
            out.push(b[i]);
            i += 1;
            continue;
        }
        let hex = |j: usize| b.get(j).and_then(|c| char::from(*c).to_digit(16));
        let (Some(hi), Some(lo)) = (hex(i + 1), hex(i + 2)) else {
            return Err(DsnError::Syntax {
                at: at + i,
                reason: "`%` is not followed by two hex digits",
            });
        };
        let c = (hi * 16 + lo) as u8;
        if c == 0 {
            return Err(DsnError::Syntax {
                at: at + i,
                reason: "`%00` (a NUL byte) is not allowed",
            });
        }
        out.push(c);
        i += 3;
    }
    Ok(out)
}

/// A DSN being parsed: the values so far, and the keywords whose value is
/// not UTF-8 (an error unless a later repeat replaces it).
struct Parsing {
    info: ConnInfo,
    not_utf8: Vec<(&'static str, usize)>,
}

impl Parsing {
    fn new(url: Option<&'static str>) -> Parsing {
        Parsing {
            info: ConnInfo {
                url,
                params: Vec::new(),
                raw_credentials: false,
            },
            not_utf8: Vec::new(),
        }
    }

    fn set(&mut self, keyword: &'static str, value: Vec<u8>, at: usize) {
        self.not_utf8.retain(|(k, _)| *k != keyword);
        let value = String::from_utf8(value).unwrap_or_else(|_| {
            self.not_utf8.push((keyword, at));
            String::new()
        });
        self.info.put(keyword, value);
    }

    fn store(&mut self, name: &[u8], value: Vec<u8>, at: usize) -> Result<(), DsnError> {
        // libpq's old spelling of sslmode.
        if name == b"requiressl" {
            let mode = if value.first() == Some(&b'1') {
                "require"
            } else {
                "prefer"
            };
            self.set("sslmode", mode.into(), at);
            return Ok(());
        }
        let k = std::str::from_utf8(name)
            .ok()
            .and_then(parse_keyword)
            .ok_or(DsnError::UnknownKeyword { at })?;
        self.set(k, value, at);
        Ok(())
    }

    fn finish(self) -> Result<ConnInfo, DsnError> {
        match self.not_utf8.first() {
            Some((_, at)) => Err(DsnError::Syntax {
                at: *at,
                reason: "percent-escapes that do not decode to UTF-8",
            }),
            None => Ok(self.info),
        }
    }
}

/// Encodes every byte outside RFC 3986's unreserved set (and `:` too
/// unless `colon`).
fn encode(s: &str, colon: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                out.push(char::from(b))
            }
            b':' if colon => out.push(':'),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// A key=value value, quoted when libpq needs it to be.
fn quote(v: &str) -> String {
    if !v.is_empty() && !v.bytes().any(|b| is_space(b) || b == b'\'' || b == b'\\') {
        return v.to_owned();
    }
    let mut out = String::with_capacity(v.len() + 2);
    out.push('\'');
    for c in v.chars() {
        if c == '\'' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('\'');
    out
}

impl ConnInfo {
    /// Parses `dsn` as libpq's `PQconninfoParse` does (see the type's docs).
    pub fn parse(dsn: &str) -> Result<ConnInfo, DsnError> {
        if let Some(at) = dsn.find('\0') {
            return Err(DsnError::Syntax {
                at,
                reason: "a NUL byte",
            });
        }
        for scheme in ["postgresql://", "postgres://"] {
            if dsn.starts_with(scheme) {
                return parse_url(dsn, scheme);
            }
        }
        parse_key_values(dsn)
    }

    /// The value of `keyword`, when the DSN sets it.
    pub fn get(&self, keyword: &str) -> Option<&str> {
        self.params
            .iter()
            .find(|(k, _)| *k == keyword)
            .map(|(_, v)| v.as_str())
    }

    /// The keywords set and their values, in the order they first appear.
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, &str)> {
        self.params.iter().map(|(k, v)| (*k, v.as_str()))
    }

    /// Whether the DSN was a `postgres://` URL (else key=value).
    pub fn is_url(&self) -> bool {
        self.url.is_some()
    }

    /// Sets `keyword` to `value` (replacing any value it had): to derive a
    /// DSN from another one without editing its text. Fails with
    /// [`DsnError::UnknownKeyword`] (`at` 0) for a keyword libpq does not know.
    ///
    /// ```
    /// let mut info = pgmq_client::ConnInfo::parse("postgres://app:s3cret@db:5432/app")?;
    /// info.set("dbname", "other")?;
    /// assert_eq!(info.to_dsn(), "postgres://app:s3cret@db:5432/other");
    /// assert!(info.set("sslmod", "require").is_err());
    /// # Ok::<(), pgmq_client::DsnError>(())
    /// ```
    pub fn set(&mut self, keyword: &str, value: &str) -> Result<(), DsnError> {
        let k = parse_keyword(keyword).ok_or(DsnError::UnknownKeyword { at: 0 })?;
        self.put(k, value.to_owned());
        Ok(())
    }

    /// The DSN as text, in its own form, **with** its password: to hand on
    /// to another program or connection, never to show (see
    /// [`redacted`](Self::redacted)). It parses to the same values.
    pub fn to_dsn(&self) -> String {
        self.render(true)
    }

    fn put(&mut self, keyword: &'static str, value: String) {
        match self.params.iter_mut().find(|(k, _)| *k == keyword) {
            Some(slot) => slot.1 = value,
            None => self.params.push((keyword, value)),
        }
    }

    /// The DSN rendered from its parsed values in its own form, the
    /// password (if any) shown as `***`: what to log or print.
    ///
    /// A URL with a `/` inside what looks like its user information, such
    /// as `postgres://app:pa/ss@db/app`, has no user information for
    /// libpq (it reads host `app`, port `pa`, database `ss@db/app`), so a
    /// password written there with a raw `/` would appear in those
    /// fields: such a URL is shown as [`DSN_RAW_CREDENTIALS`](crate::DSN_RAW_CREDENTIALS) instead (write
    /// the `/` as `%2F`).
    ///
    /// ```
    /// use pgmq_client::ConnInfo;
    /// let info = ConnInfo::parse("postgres://app:pa/ss@db/app")?;
    /// assert_eq!(info.redacted(), pgmq_client::DSN_RAW_CREDENTIALS);
    /// let info = ConnInfo::parse("postgres://app:pa%2Fss@db/app")?;
    /// assert_eq!(info.redacted(), "postgres://app:***@db/app");
    /// # Ok::<(), pgmq_client::DsnError>(())
    /// ```
    pub fn redacted(&self) -> String {
        if self.raw_credentials {
            return RAW_CREDENTIALS.to_owned();
        }
        self.render(false)
    }

    /// The DSN as text, the password shown only with `password`.
    fn render(&self, password: bool) -> String {
        let shown = |k: &str, v: &str| match (k, password) {
            ("password", false) => "***".to_owned(),
            _ => v.to_owned(),
        };
        match self.url {
            Some(scheme) => self.render_url(scheme, password),
            None => self
                .params
                .iter()
                .map(|(k, v)| format!("{k}={}", quote(&shown(k, v))))
                .collect::<Vec<_>>()
                .join(" "),
        }
    }

    fn render_url(&self, scheme: &str, show_password: bool) -> String {
        let mut out = String::from(scheme);
        let mut in_query: Vec<&str> = Vec::new();
        let user = self.get("user");
        let password = self.get("password");
        if let Some("") = user {
            in_query.push("user");
        }
        let user = user.filter(|u| !u.is_empty());
        if user.is_some() || password.is_some() {
            if let Some(u) = user {
                out.push_str(&encode(u, false));
            }
            match password {
                // An empty password in the user information is no password.
                Some("") if show_password => in_query.push("password"),
                Some(p) if show_password => {
                    out.push(':');
                    out.push_str(&encode(p, false));
                }
                Some(_) => out.push_str(":***"),
                None => {}
            }
            out.push('@');
        }
        // The host and port lists go where a URL puts them when parsing that
        // URL gives the same lists back; else into the query.
        let (host, port) = (self.get("host"), self.get("port"));
        let netloc = match (host, port) {
            (None, None) => true,
            (Some(h), None) => !h.is_empty() && !h.contains(','),
            (None, Some(p)) => !p.is_empty() && !p.contains(','),
            (Some(h), Some(p)) => {
                !h.is_empty() && !p.is_empty() && h.split(',').count() == p.split(',').count()
            }
        };
        if netloc {
            let hosts: Vec<&str> = host.unwrap_or("").split(',').collect();
            let mut ports = port.map(|p| p.split(','));
            let pairs: Vec<String> = hosts
                .iter()
                .map(|h| {
                    let mut s = if h.contains(':') {
                        format!("[{}]", encode(h, true))
                    } else {
                        encode(h, false)
                    };
                    if let Some(p) = ports.as_mut().and_then(|p| p.next()) {
                        if !p.is_empty() {
                            s.push(':');
                            s.push_str(&encode(p, false));
                        }
                    }
                    s
                })
                .collect();
            out.push_str(&pairs.join(","));
        } else {
            in_query.extend(["host", "port"]);
        }
        match self.get("dbname") {
            Some("") => in_query.push("dbname"),
            Some(d) => {
                out.push('/');
                out.push_str(&encode(d, false));
            }
            None => {}
        }
        let query: Vec<String> = self
            .params
            .iter()
            .filter(|(k, _)| {
                !matches!(*k, "user" | "password" | "host" | "port" | "dbname")
                    || in_query.contains(k)
            })
            .map(|(k, v)| format!("{k}={}", encode(v, false)))
            .collect();
        if !query.is_empty() {
            out.push('?');
            out.push_str(&query.join("&"));
        }
        out
    }
}

fn parse_url(dsn: &str, scheme: &'static str) -> Result<ConnInfo, DsnError> {
    let b = dsn.as_bytes();
    let n = b.len();
    let at = |i: usize| b.get(i).copied().unwrap_or(0);
    let mut info = Parsing::new(Some(scheme));
    let mut p = scheme.len();
    // User information: up to the first '@' before any '/'.
    let mut q = p;
    while q < n && b[q] != b'@' && b[q] != b'/' {
        q += 1;
    }
    if at(q) == b'@' {
        let colon = dsn[p..q].find(':').map(|i| p + i);
        let user_end = colon.unwrap_or(q);
        if user_end > p {
            info.set("user", decode(&dsn[p..user_end], p)?, p);
        }
        if let Some(c) = colon {
            if q > c + 1 {
                info.set("password", decode(&dsn[c + 1..q], c + 1)?, c + 1);
            }
        }
        p = q + 1;
    } else {
        // No user information: a `user:pass/word@host` the user meant as
        // one (a ':' in what libpq takes as the authority, an '@' after
        // it) is kept from the redacted form.
        info.info.raw_credentials = dsn[p..q].contains(':') && q < n && dsn[q..].contains('@');
    }
    // host[:port] pairs, comma-separated.
    let hosts_at = p;
    let mut hosts = String::new();
    let mut ports = String::new();
    let mut prev;
    loop {
        if at(p) == b'[' {
            let start = p + 1;
            let mut e = start;
            while e < n && b[e] != b']' {
                e += 1;
            }
            if e == n {
                return Err(DsnError::Syntax {
                    at: p,
                    reason: "no `]` closes the IPv6 address",
                });
            }
            if e == start {
                return Err(DsnError::Syntax {
                    at: p,
                    reason: "an empty IPv6 address",
                });
            }
            hosts.push_str(&dsn[start..e]);
            p = e + 1;
            if !matches!(at(p), 0 | b':' | b'/' | b'?' | b',') {
                return Err(DsnError::Syntax {
                    at: p,
                    reason: "expected `:`, `/`, `?` or `,` after an IPv6 address",
                });
            }
        } else {
            let start = p;
            while p < n && !matches!(b[p], b':' | b'/' | b'?' | b',') {
                p += 1;
            }
            hosts.push_str(&dsn[start..p]);
        }
        prev = at(p);
        if prev == b':' {
            p += 1;
            let start = p;
            while p < n && !matches!(b[p], b'/' | b'?' | b',') {
                p += 1;
            }
            ports.push_str(&dsn[start..p]);
            prev = at(p);
        }
        if prev != b',' {
            break;
        }
        p += 1;
        hosts.push(',');
        ports.push(',');
    }
    if !hosts.is_empty() {
        info.set("host", decode(&hosts, hosts_at)?, hosts_at);
    }
    if !ports.is_empty() {
        info.set("port", decode(&ports, hosts_at)?, hosts_at);
    }
    if prev == b'/' {
        p += 1;
        let start = p;
        while p < n && b[p] != b'?' {
            p += 1;
        }
        if p > start {
            info.set("dbname", decode(&dsn[start..p], start)?, start);
        }
        prev = at(p);
    }
    if prev == b'?' {
        parse_query(&mut info, dsn, p + 1)?;
    }
    info.finish()
}

fn parse_query(info: &mut Parsing, dsn: &str, mut i: usize) -> Result<(), DsnError> {
    let b = dsn.as_bytes();
    let n = b.len();
    while i < n {
        let start = i;
        let mut eq = None;
        while i < n && b[i] != b'&' {
            if b[i] == b'=' {
                if eq.is_some() {
                    return Err(DsnError::Syntax {
                        at: i,
                        reason: "a second `=` in a query parameter",
                    });
                }
                eq = Some(i);
            }
            i += 1;
        }
        let Some(eq) = eq else {
            return Err(DsnError::Syntax {
                at: start,
                reason: "a query parameter without `=`",
            });
        };
        let key = decode(&dsn[start..eq], start)?;
        let value = decode(&dsn[eq + 1..i], eq + 1)?;
        if i < n {
            i += 1;
        }
        // libpq's concession to JDBC URLs.
        if key == b"ssl" && value == b"true" {
            info.set("sslmode", b"require".to_vec(), start);
        } else {
            info.store(&key, value, start)?;
        }
    }
    Ok(())
}

fn parse_key_values(dsn: &str) -> Result<ConnInfo, DsnError> {
    let b = dsn.as_bytes();
    let n = b.len();
    let mut info = Parsing::new(None);
    let mut i = 0;
    loop {
        while i < n && is_space(b[i]) {
            i += 1;
        }
        if i == n {
            return info.finish();
        }
        let key_at = i;
        while i < n && b[i] != b'=' && !is_space(b[i]) {
            i += 1;
        }
        let key_end = i;
        while i < n && is_space(b[i]) {
            i += 1;
        }
        if i == n || b[i] != b'=' {
            return Err(DsnError::Syntax {
                at: key_at,
                reason: "a keyword without `=`",
            });
        }
        i += 1;
        while i < n && is_space(b[i]) {
            i += 1;
        }
        let mut value = Vec::new();
        if i < n && b[i] == b'\'' {
            let quote_at = i;
            i += 1;
            loop {
                if i == n {
                    return Err(DsnError::Syntax {
                        at: quote_at,
                        reason: "a quoted value without its closing `'`",
                    });
                }
                match b[i] {
                    b'\\' => {
                        i += 1;
                        if i < n {
                            value.push(b[i]);
                            i += 1;
                        }
                    }
                    b'\'' => {
                        i += 1;
                        break;
                    }
                    c => {
                        value.push(c);
                        i += 1;
                    }
                }
            }
        } else {
            while i < n {
                match b[i] {
                    c if is_space(c) => {
                        i += 1;
                        break;
                    }
                    b'\\' => {
                        i += 1;
                        if i < n {
                            value.push(b[i]);
                            i += 1;
                        }
                    }
                    c => {
                        value.push(c);
                        i += 1;
                    }
                }
            }
        }
        info.store(&b[key_at..key_end], value, key_at)?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(dsn: &str) -> Vec<(&'static str, String)> {
        let mut p = ConnInfo::parse(dsn).unwrap().params;
        p.sort();
        p
    }

    fn kv(pairs: &[(&'static str, &str)]) -> Vec<(&'static str, String)> {
        let mut p: Vec<_> = pairs.iter().map(|(k, v)| (*k, v.to_string())).collect();
        p.sort();
        p
    }

    #[test]
    fn urls_as_libpq() {
        assert_eq!(
            parsed("postgres://qpw:pa?ss@127.0.0.1:5/postgres?sslmode=require"),
            kv(&[
                ("user", "qpw"),
                ("password", "pa?ss"),
                ("host", "127.0.0.1"),
                ("port", "5"),
                ("dbname", "postgres"),
                ("sslmode", "require")
            ])
        );
        assert_eq!(
            parsed("postgres://[::1]:5,h/?host="),
            kv(&[("host", ""), ("port", "5,")])
        );
        assert_eq!(
            parsed("postgresql://h/d?ssl=true&requiressl=0"),
            kv(&[("host", "h"), ("dbname", "d"), ("sslmode", "prefer")])
        );
        for bad in [
            "postgres://h/?application_name=%zé",
            "postgres://a%00",
            "postgres://h/?x=1",
            "postgres://h/?a",
            "postgres://h/?a=b=c",
            "postgres://[::1",
            "postgres://[]",
            "postgres://[::1]x",
        ] {
            assert!(ConnInfo::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn key_values_as_libpq() {
        assert_eq!(
            parsed(r"host = h password='a b\'c' user=u\ v port=1 port=2"),
            kv(&[
                ("host", "h"),
                ("password", "a b'c"),
                ("user", "u v"),
                ("port", "2")
            ])
        );
        assert_eq!(
            parsed("host='x'port=1"),
            kv(&[("host", "x"), ("port", "1")])
        );
        for bad in [
            "host",
            "host=h x=1",
            "=1",
            "password='open",
            " postgres://h",
        ] {
            assert!(ConnInfo::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(parsed(""), kv(&[]));
    }

    #[test]
    fn redaction_renders_the_parsed_fields() {
        let r = |d: &str| ConnInfo::parse(d).unwrap().redacted();
        assert_eq!(
            r("postgres://app@db/app?password=s3cret&application_name=ops@acme"),
            "postgres://app:***@db/app?application_name=ops%40acme"
        );
        assert_eq!(
            r("postgres://app@db:5432/app?password=hunter@2x"),
            "postgres://app:***@db:5432/app"
        );
        assert_eq!(r("postgres://[::1]:5,h/d"), "postgres://[::1]:5,h/d");
        assert_eq!(
            r("host=h password=x options='-c a=b'"),
            "host=h password=*** options='-c a=b'"
        );
    }
}
