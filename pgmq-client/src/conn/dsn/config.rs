//! A parsed DSN made into a `tokio_postgres::Config`, through its setters,
//! with libpq's checks of the values (`connectOptions2`, `pqParseIntParam`).

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use tokio_postgres::config::{
    ChannelBinding, LoadBalanceHosts, SslNegotiation, TargetSessionAttrs,
};

use super::parse::{ConnInfo, DsnError};

/// What a DSN says, ready for tokio-postgres.
pub(crate) struct Settings {
    /// Everything but `sslmode` (see [`crate::conn::tls::TlsSettings`]) and the
    /// builder's defaults.
    pub(crate) config: tokio_postgres::Config,
    /// The DSN's `connect_timeout`: `Some(None)` when it asks for none (0).
    pub(crate) connect_timeout: Option<Option<Duration>>,
    /// Whether the DSN sets any keepalive setting.
    pub(crate) keepalives_set: bool,
    /// Whether the DSN sets `tcp_user_timeout`.
    pub(crate) tcp_user_timeout_set: bool,
    /// The DSN's `passfile`.
    pub(crate) passfile: Option<PathBuf>,
}

/// libpq's `pqParseIntParam`: an `int`, with whitespace around it.
fn parse_int(keyword: &'static str, v: &str) -> Result<i32, DsnError> {
    let t = v.trim_matches(|c: char| {
        c.is_ascii() && matches!(c as u8, b' ' | b'\t' | b'\n' | b'\x0b' | b'\x0c' | b'\r')
    });
    t.parse::<i32>().map_err(|_| DsnError::InvalidValue {
        keyword,
        reason: "must be an integer".to_owned(),
    })
}

fn one_of<T: Copy>(keyword: &'static str, v: &str, choices: &[(&str, T)]) -> Result<T, DsnError> {
    choices
        .iter()
        .find(|(name, _)| *name == v)
        .map(|(_, t)| *t)
        .ok_or_else(|| DsnError::InvalidValue {
            keyword,
            reason: format!(
                "must be one of {}",
                choices
                    .iter()
                    .map(|(n, _)| *n)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        })
}

fn unsupported(keyword: &'static str, reason: &'static str) -> DsnError {
    DsnError::Unsupported { keyword, reason }
}

/// Makes `info` into tokio-postgres settings, refusing what tokio-postgres
/// cannot honour (naming the keyword) rather than ignoring it.
pub(crate) fn settings(info: &ConnInfo) -> Result<Settings, DsnError> {
    let mut c = tokio_postgres::Config::new();
    let mut out = Settings {
        config: tokio_postgres::Config::new(),
        connect_timeout: None,
        keepalives_set: false,
        tcp_user_timeout_set: false,
        passfile: None,
    };
    hosts(info, &mut c)?;
    let fallback_name = info.get("fallback_application_name");
    for (k, v) in info.iter() {
        match k {
            "host" | "hostaddr" | "port" | "fallback_application_name" => {}
            // Read by the TLS settings.
            "sslmode" | "sslrootcert" | "sslcert" | "sslkey" => {}
            // libpq treats an empty value as not given.
            _ if v.is_empty() => {}
            "user" => {
                c.user(v);
            }
            "password" => {
                c.password(v);
            }
            "dbname" => {
                c.dbname(v);
            }
            "options" => {
                c.options(v);
            }
            "application_name" => {
                c.application_name(v);
            }
            "passfile" => out.passfile = Some(PathBuf::from(v)),
            "connect_timeout" => {
                // libpq: none for 0 or less, at least 2 seconds otherwise.
                let s = parse_int(k, v)?;
                out.connect_timeout = Some((s > 0).then(|| Duration::from_secs(s.max(2) as u64)));
            }
            "keepalives" => {
                c.keepalives(parse_int(k, v)? != 0);
                out.keepalives_set = true;
            }
            "keepalives_idle" | "keepalives_interval" | "keepalives_count" => {
                let n = parse_int(k, v)?;
                out.keepalives_set = true;
                if n > 0 {
                    let n = n as u64;
                    match k {
                        "keepalives_idle" => c.keepalives_idle(Duration::from_secs(n)),
                        "keepalives_interval" => c.keepalives_interval(Duration::from_secs(n)),
                        _ => c.keepalives_retries(n as u32),
                    };
                }
            }
            "tcp_user_timeout" => {
                // Milliseconds, as in libpq; 0 is the system's default.
                let ms = parse_int(k, v)?;
                out.tcp_user_timeout_set = true;
                if ms > 0 {
                    c.tcp_user_timeout(Duration::from_millis(ms as u64));
                }
            }
            "target_session_attrs" => {
                if matches!(v, "primary" | "standby" | "prefer-standby") {
                    return Err(unsupported(
                        k,
                        "tokio-postgres knows only any, read-write and read-only",
                    ));
                }
                c.target_session_attrs(one_of(
                    k,
                    v,
                    &[
                        ("any", TargetSessionAttrs::Any),
                        ("read-write", TargetSessionAttrs::ReadWrite),
                        ("read-only", TargetSessionAttrs::ReadOnly),
                    ],
                )?);
            }
            "channel_binding" => {
                c.channel_binding(one_of(
                    k,
                    v,
                    &[
                        ("disable", ChannelBinding::Disable),
                        ("prefer", ChannelBinding::Prefer),
                        ("require", ChannelBinding::Require),
                    ],
                )?);
            }
            "sslnegotiation" => {
                c.ssl_negotiation(one_of(
                    k,
                    v,
                    &[
                        ("postgres", SslNegotiation::Postgres),
                        ("direct", SslNegotiation::Direct),
                    ],
                )?);
            }
            "load_balance_hosts" => {
                c.load_balance_hosts(one_of(
                    k,
                    v,
                    &[
                        ("disable", LoadBalanceHosts::Disable),
                        ("random", LoadBalanceHosts::Random),
                    ],
                )?);
            }
            // Settings whose only value tokio-postgres and rustls can honour
            // is the one they always use.
            "client_encoding" if v.eq_ignore_ascii_case("utf8") => {}
            "client_encoding" => {
                return Err(unsupported(k, "tokio-postgres always uses UTF8"));
            }
            "sslcompression" if v == "0" => {}
            "sslsni" if v == "1" => {}
            "gssencmode" if matches!(v, "disable" | "prefer") => {}
            "ssl_min_protocol_version" if matches!(v, "TLSv1" | "TLSv1.1" | "TLSv1.2") => {}
            "service" => {
                return Err(unsupported(
                    k,
                    "the service file (pg_service.conf) is not read: give the settings in the DSN",
                ));
            }
            _ => {
                return Err(unsupported(
                    k,
                    "tokio-postgres cannot honour this setting; leave it out",
                ));
            }
        }
    }
    if c.get_application_name().is_none() {
        if let Some(name) = fallback_name.filter(|n| !n.is_empty()) {
            c.application_name(name);
        }
    }
    out.config = c;
    Ok(out)
}

/// The host, hostaddr and port lists, matched as libpq matches them: one
/// port for every host, or one for all; an empty port is 5432.
fn hosts(info: &ConnInfo, c: &mut tokio_postgres::Config) -> Result<(), DsnError> {
    let list = |k| {
        info.get(k)
            .filter(|v| !v.is_empty())
            .map(|v| v.split(',').collect::<Vec<_>>())
    };
    let hosts = list("host").unwrap_or_default();
    let addrs = list("hostaddr").unwrap_or_default();
    if !hosts.is_empty() && !addrs.is_empty() && hosts.len() != addrs.len() {
        return Err(DsnError::InvalidValue {
            keyword: "hostaddr",
            reason: format!("{} addresses for {} hosts", addrs.len(), hosts.len()),
        });
    }
    let count = hosts.len().max(addrs.len());
    if count == 0 {
        return Err(DsnError::InvalidValue {
            keyword: "host",
            reason: "no host: name a host name, IP address or socket directory (pgmq-client \
                     does not guess libpq's built-in socket directory)"
                .to_owned(),
        });
    }
    for h in &hosts {
        if h.is_empty() && addrs.is_empty() {
            return Err(DsnError::InvalidValue {
                keyword: "host",
                reason: "an empty host in the list (libpq's built-in socket directory is \
                         not guessed)"
                    .to_owned(),
            });
        }
        c.host(*h);
    }
    for a in &addrs {
        let ip: IpAddr = a.parse().map_err(|_| DsnError::InvalidValue {
            keyword: "hostaddr",
            reason: "each address must be a numeric IPv4 or IPv6 address".to_owned(),
        })?;
        c.hostaddr(ip);
    }
    if let Some(ports) = list("port") {
        if ports.len() != 1 && ports.len() != count {
            return Err(DsnError::InvalidValue {
                keyword: "port",
                reason: format!("{} ports for {count} hosts", ports.len()),
            });
        }
        for p in ports {
            let port = if p.is_empty() {
                5432
            } else {
                match parse_int("port", p)? {
                    n @ 1..=65535 => n as u16,
                    _ => {
                        return Err(DsnError::InvalidValue {
                            keyword: "port",
                            reason: "must be from 1 to 65535".to_owned(),
                        })
                    }
                }
            };
            c.port(port);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conf(dsn: &str) -> Result<Settings, DsnError> {
        settings(&ConnInfo::parse(dsn).unwrap())
    }

    #[test]
    fn lists_and_values() {
        let s =
            conf("postgres://u:p@h1,h2:5433/d?connect_timeout=1&tcp_user_timeout=1500").unwrap();
        assert_eq!(s.config.get_hosts().len(), 2);
        assert_eq!(s.config.get_ports(), &[5432, 5433]);
        assert_eq!(s.connect_timeout, Some(Some(Duration::from_secs(2))));
        assert_eq!(
            s.config.get_tcp_user_timeout(),
            Some(&Duration::from_millis(1500))
        );
        assert_eq!(
            conf("host=h connect_timeout=0").unwrap().connect_timeout,
            Some(None)
        );
        assert_eq!(conf("host=h port=1").unwrap().config.get_ports(), &[1]);
        for (bad, keyword) in [
            ("host=h port=x", "port"),
            ("host=h port=0", "port"),
            ("host=a,b port=1,2,3", "port"),
            ("user=u", "host"),
            ("host=a,,b", "host"),
            ("host=h hostaddr=1.2.3.4,1.2.3.5", "hostaddr"),
            ("host=h connect_timeout=2s", "connect_timeout"),
            (
                "host=h target_session_attrs=primary",
                "target_session_attrs",
            ),
            ("host=h channel_binding=maybe", "channel_binding"),
            ("host=h service=x", "service"),
            ("host=h requirepeer=x", "requirepeer"),
        ] {
            let err = conf(bad).err().unwrap_or_else(|| panic!("{bad} accepted"));
            let named = match &err {
                DsnError::InvalidValue { keyword, .. } | DsnError::Unsupported { keyword, .. } => {
                    *keyword
                }
                _ => "",
            };
            assert_eq!(named, keyword, "{bad}: {err}");
        }
        // Values libpq would accept and that are what tokio-postgres does anyway.
        conf("host=h sslsni=1 sslcompression=0 gssencmode=prefer client_encoding=UTF8").unwrap();
    }
}
