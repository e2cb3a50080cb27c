//! What in a URI is a secret, and hiding it in everything shown, for every
//! scheme: a Redis URI may carry a password (`redis://user:password@host`,
//! `?password=`), and a URI of any scheme may carry a query parameter that
//! looks like one (`file:///dev/shm/x?token=...`, which engine-state refuses,
//! but its error shows the URI). The one owner: the Redis target, the URI
//! parser and the binaries all hide credentials through [`redact`].

/// Hides every credential of a URI: the password of `scheme://user:password@host`
/// (the user part of `redis://secret@host`), and the value of every query
/// parameter whose name looks like one ([`is_secret_parameter`]:
/// `?password=`, `?pass=`, `?token=`, ...). Used for every `Display`,
/// `Debug` and error text of a URI.
pub fn redact(uri: &str) -> String {
    let hidden = redact_userinfo(uri);
    let Some((base, rest)) = hidden.split_once('?') else {
        return hidden;
    };
    let (query, fragment) = match rest.split_once('#') {
        Some((query, fragment)) => (query, Some(fragment)),
        None => (rest, None),
    };
    let query: Vec<String> = query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((name, _value)) if is_secret_parameter(name) => format!("{name}=***"),
            _ => pair.to_owned(),
        })
        .collect();
    let mut out = format!("{base}?{}", query.join("&"));
    if let Some(fragment) = fragment {
        out.push('#');
        out.push_str(fragment);
    }
    out
}

/// True for a query parameter name that may carry a credential (`password`,
/// `pass`, `passwd`, `pwd`, `token`, `secret`, `auth`, `key`, any case, also
/// as part of a longer name such as `api_key`): its value is never shown.
pub fn is_secret_parameter(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    ["pass", "pwd", "token", "secret", "auth", "key", "cred"]
        .iter()
        .any(|word| name.contains(word))
}

fn redact_userinfo(uri: &str) -> String {
    let Some((scheme, rest)) = uri.split_once("://") else {
        return uri.to_owned();
    };
    let Some((userinfo, host)) = rest.rsplit_once('@') else {
        return uri.to_owned();
    };
    match userinfo.split_once(':') {
        Some((user, _password)) => format!("{scheme}://{user}:***@{host}"),
        None if scheme.starts_with("redis") => format!("{scheme}://***@{host}"),
        None => uri.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hides_userinfo_passwords_and_secret_parameters_whatever_the_scheme() {
        assert_eq!(redact("rediss://:pw@h:1"), "rediss://:***@h:1");
        assert_eq!(redact("redis://pw@h:1"), "redis://***@h:1");
        assert_eq!(redact("redis://h:1/0"), "redis://h:1/0");
        assert_eq!(
            redact("redis://h:1/0?prefix=p:&password=PW&Pass=PW&x_token=PW&ttl_ms=5#insecure"),
            "redis://h:1/0?prefix=p:&password=***&Pass=***&x_token=***&ttl_ms=5#insecure"
        );
        assert_eq!(
            redact("redis+unix:///tmp/r.sock?pass=PW"),
            "redis+unix:///tmp/r.sock?pass=***"
        );
        assert_eq!(
            redact("redis://:PW@h:1/0?pwd=PW"),
            "redis://:***@h:1/0?pwd=***"
        );
        assert_eq!(
            redact("file:///dev/shm/x?password=hunter2"),
            "file:///dev/shm/x?password=***"
        );
        assert_eq!(
            redact("file:///d?token=t&mode=1&API_KEY=k"),
            "file:///d?token=***&mode=1&API_KEY=***"
        );
        assert_eq!(redact("/dev/shm/x?secret=s"), "/dev/shm/x?secret=***");
        assert_eq!(
            redact("file://u:pw@localhost/d"),
            "file://u:***@localhost/d"
        );
        assert_eq!(redact("file:///dev/shm/x"), "file:///dev/shm/x");
    }
}
