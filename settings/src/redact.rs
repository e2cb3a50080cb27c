//! What in a URI is a secret, and hiding it in everything shown, for every
//! scheme: a URI may carry a credential in its user part
//! (`redis://user:password@host`, `redis://token@host`,
//! `file://token@localhost/d`) or in its query (`?password=`, and any name
//! spelled so that no list of words catches it: `?%70assword=`). The one
//! owner: the Redis target, the URI parser and the binaries all hide
//! credentials through [`redact`]; docs/FORMAT.md (table `uri_redact`) states
//! the rule for other readers, and esdump-go applies the same table.

/// The query parameters whose values are shown: the ones the Redis URI
/// parser accepts (`prefix`, `ttl_ms`, `timeout_ms`), none of which is a
/// credential. Every other parameter's value is hidden, whatever its name,
/// so the rule does not depend on decoding or on guessing what a name means.
pub const VISIBLE_PARAMETERS: [&str; 3] = ["prefix", "ttl_ms", "timeout_ms"];

/// Hides every credential of a URI: the user part of the authority
/// (`scheme://user:password@host` becomes `scheme://user:***@host`,
/// `scheme://token@host` becomes `scheme://***@host`, in every scheme), and
/// the value of every query parameter not in [`VISIBLE_PARAMETERS`]. The
/// authority ends at the first `/`, `?` or `#` after `scheme://`: an `@` in a
/// path (`file:///dev/shm/a:b@c`) is not a user part. Used for every
/// `Display`, `Debug` and error text of a URI.
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
            Some((name, _value)) if !VISIBLE_PARAMETERS.contains(&name) => format!("{name}=***"),
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

/// True for a query parameter name that looks like a credential
/// (`password`, `pass`, `passwd`, `pwd`, `token`, `secret`, `auth`, `key`,
/// any case, also as part of a longer name such as `api_key`). Only for
/// hints (the Redis parser tells where a password goes); [`redact`] hides
/// every value not in [`VISIBLE_PARAMETERS`], whatever this says.
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
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let Some((userinfo, host)) = authority.rsplit_once('@') else {
        return uri.to_owned();
    };
    match userinfo.split_once(':') {
        Some((user, _password)) => format!("{scheme}://{user}:***@{host}{tail}"),
        None => format!("{scheme}://***@{host}{tail}"),
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
            "file:///d?token=***&mode=***&API_KEY=***"
        );
        assert_eq!(redact("/dev/shm/x?secret=s"), "/dev/shm/x?secret=***");
        assert_eq!(
            redact("file://u:pw@localhost/d"),
            "file://u:***@localhost/d"
        );
        assert_eq!(redact("file:///dev/shm/x"), "file:///dev/shm/x");
    }

    #[test]
    fn a_token_alone_in_the_user_part_is_hidden_in_every_scheme() {
        assert_eq!(
            redact("file://hunter2@localhost/d"),
            "file://***@localhost/d"
        );
        assert_eq!(redact("redis://token@host"), "redis://***@host");
        assert_eq!(redact("http://token@host/x"), "http://***@host/x");
    }

    #[test]
    fn an_at_sign_in_the_path_or_query_is_not_a_user_part() {
        assert_eq!(redact("file:///dev/shm/a:b@c"), "file:///dev/shm/a:b@c");
        assert_eq!(
            redact("redis://h:1/0?prefix=a@b"),
            "redis://h:1/0?prefix=a@b"
        );
        assert_eq!(redact("redis://u:pw@h:1/0/x@y"), "redis://u:***@h:1/0/x@y");
    }

    #[test]
    fn every_query_value_but_the_known_parameters_is_hidden_however_spelled() {
        assert_eq!(
            redact("redis://h/0?%70assword=pw"),
            "redis://h/0?%70assword=***"
        );
        assert_eq!(
            redact("redis://h/0?prefix=p&ttl_ms=5&timeout_ms=9&x=1"),
            "redis://h/0?prefix=p&ttl_ms=5&timeout_ms=9&x=***"
        );
    }
}
