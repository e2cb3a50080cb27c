//! Hiding the credentials of a URI in everything shown: a Redis URI may
//! carry a password (`redis://user:password@host`, `?password=`).

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
