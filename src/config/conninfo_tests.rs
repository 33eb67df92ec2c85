use super::*;

fn parse(s: &str) -> ConnInfo {
    s.parse().unwrap_or_else(|e| panic!("{s:?}: {e}"))
}

#[test]
fn url_form() {
    let c = parse(
        "postgres://walbox:s3cret@db.example.com:6543/app?sslmode=verify-full\
         &sslrootcert=/etc/ca.pem&application_name=relay&connect_timeout=7",
    );
    assert_eq!(c.host, Host::Tcp("db.example.com".into()));
    assert_eq!(c.port, 6543);
    assert_eq!(c.user, "walbox");
    assert_eq!(c.password.as_deref(), Some("s3cret"));
    assert_eq!(c.dbname, "app");
    assert_eq!(c.sslmode, SslMode::VerifyFull);
    assert_eq!(c.sslrootcert, Some(PathBuf::from("/etc/ca.pem")));
    assert_eq!(c.application_name, "relay");
    assert_eq!(c.connect_timeout, Some(Duration::from_secs(7)));

    let c = parse("postgresql://u@[::1]:5433/d");
    assert_eq!(c.host, Host::Tcp("::1".into()));
    assert_eq!(c.port, 5433);
    assert_eq!(c.password, None);
    assert_eq!(c.sslmode, SslMode::Prefer);
    assert_eq!(c.application_name, "walbox");
    assert_eq!(c.connect_timeout, None);
}

#[test]
fn url_defaults() {
    let c = parse("postgres://u@h");
    assert_eq!(c.port, 5432);
    assert_eq!(c.dbname, "u", "dbname defaults to the user");
    let c = parse("postgres://u@h/?connect_timeout=0");
    assert_eq!(c.connect_timeout, None);
    assert_eq!(c.dbname, "u");
}

#[test]
fn default_user_comes_from_environment() {
    if let Ok(user) = std::env::var("USER") {
        if !user.is_empty() {
            let c = parse("host=h");
            assert_eq!(c.user, user);
            assert_eq!(c.dbname, user);
        }
    }
}

#[test]
fn default_host() {
    let c = parse("user=u");
    let expected = if Path::new(DEFAULT_SOCKET_DIR).exists() {
        Host::Unix(DEFAULT_SOCKET_DIR.into())
    } else {
        Host::Tcp("localhost".into())
    };
    assert_eq!(c.host, expected);
}

#[test]
fn percent_encoding() {
    let c = parse("postgres://us%40er:p%40ss%2Fw%3Ard@h/my%20db?application_name=a%26b");
    assert_eq!(c.user, "us@er");
    assert_eq!(c.password.as_deref(), Some("p@ss/w:rd"));
    assert_eq!(c.dbname, "my db");
    assert_eq!(c.application_name, "a&b");
    // An unencoded '@' in the password still works: the last '@' ends the user info.
    let c = parse("postgres://u:p@ss@h/d");
    assert_eq!(c.password.as_deref(), Some("p@ss"));
}

#[test]
fn url_password_may_hold_query_characters_as_libpq_allows() {
    // libpq finds the user info before it splits off the query: '?', '&', '=' and '#' stay in
    // the password.
    let c = parse("postgresql://walbox:abc?LEAK4@host/db");
    assert_eq!(c.user, "walbox");
    assert_eq!(c.password.as_deref(), Some("abc?LEAK4"));
    assert_eq!(c.host, Host::Tcp("host".into()));
    assert_eq!(c.dbname, "db");
    let c = parse("postgresql://walbox:a?b&c=d#e@host:6000?sslmode=require");
    assert_eq!(c.password.as_deref(), Some("a?b&c=d#e"));
    assert_eq!(c.port, 6000);
    assert_eq!(c.dbname, "walbox");
    assert_eq!(c.sslmode, SslMode::Require);
    let c = parse("postgresql://u:p?x@ss@h?application_name=me@corp");
    assert_eq!(c.password.as_deref(), Some("p?x@ss"));
    assert_eq!(c.host, Host::Tcp("h".into()));
    assert_eq!(c.application_name, "me@corp");
    // An '@' in a query value is not the end of a user info.
    let c = parse("postgresql://u:p@h/d?application_name=me@corp");
    assert_eq!(c.password.as_deref(), Some("p"));
    assert_eq!(c.application_name, "me@corp");
    let c = parse("postgresql://u@h?application_name=me@corp");
    assert_eq!((c.user.as_str(), c.password.as_deref()), ("u", None));
    assert_eq!(c.application_name, "me@corp");
    assert_eq!(c.host, Host::Tcp("h".into()));
}

#[test]
fn unix_sockets() {
    let c = parse("postgres://u@%2Fvar%2Frun%2Fpostgresql:5433/d");
    assert_eq!(c.host, Host::Unix("/var/run/postgresql".into()));
    assert_eq!(
        c.unix_socket_path(),
        Some(PathBuf::from("/var/run/postgresql/.s.PGSQL.5433"))
    );
    assert!(!c.tls_applies());
    let c = parse("postgres:///d?host=/tmp/sock&user=u&port=7");
    assert_eq!(c.host, Host::Unix("/tmp/sock".into()));
    assert_eq!(c.port, 7);
    let c = parse("host=/tmp user=u");
    assert_eq!(c.host, Host::Unix("/tmp".into()));
    assert_eq!(
        c.unix_socket_path(),
        Some(PathBuf::from("/tmp/.s.PGSQL.5432"))
    );
}

#[test]
fn keyword_value_form() {
    let c = parse(
        "host=db port = 6000 user=walbox password='it\\'s a secret' dbname=app \
         sslmode=require application_name='walbox east'",
    );
    assert_eq!(c.host, Host::Tcp("db".into()));
    assert_eq!(c.port, 6000);
    assert_eq!(c.password.as_deref(), Some("it's a secret"));
    assert_eq!(c.dbname, "app");
    assert_eq!(c.sslmode, SslMode::Require);
    assert_eq!(c.application_name, "walbox east");
    let c = parse("user=u password='' dbname=''");
    assert_eq!(c.password.as_deref(), Some(""));
    assert_eq!(c.dbname, "u");
}

#[test]
fn errors() {
    for (s, needle) in [
        (
            "host=h user=u sslmdoe=require",
            "unknown connection parameter \"sslmdoe\" (did you mean sslmode?)",
        ),
        (
            "postgres://u@h/d?sslmdoe=require",
            "unknown connection parameter (not shown: it may be part of a password) (did you \
             mean sslmode?)",
        ),
        (
            "host=h user=u replication=database",
            "unknown connection parameter",
        ),
        ("host=h user=u sslmode=allow", "sslmode"),
        ("host=h user=u port=0", "port"),
        ("host=h user=u port=70000", "port"),
        ("postgres://u@h:x/d", "port"),
        ("host=h user=u connect_timeout=-1", "connect_timeout"),
        ("host=h user=u password='abc", "unterminated"),
        ("host=h user", "missing '=' after \"user\""),
        ("host=h user=u dbname", "missing '=' after \"dbname\""),
        ("host=h user=u mydb", "missing '=' after word 3"),
        ("postgres:/u@h/d", "postgres://"),
        ("postgres://u@h1,,h2/d", "an empty host"),
        ("postgres://u@h/d?sslmode", "has no '='"),
        ("postgres://u@h/d%zz", "percent-encoding"),
        ("postgres://u@[::1/d", "unterminated '['"),
    ] {
        let e = s.parse::<ConnInfo>().expect_err(s).to_string();
        assert!(e.contains(needle), "{s:?}: {e:?} lacks {needle:?}");
        assert!(!e.contains('\n'), "one line: {e:?}");
    }
}

#[test]
fn errors_never_contain_the_password() {
    for (s, secrets) in [
        // Unquoted space: "cd" and "ef" may be password fragments.
        ("user=u host=h password=ab cd=ef", &["cd", "ef"][..]),
        ("user=u host=h password=ab cd", &["cd"]),
        ("user=u host=h password=ab port=hunter2", &["hunter2"]),
        // '/' in a URL password cuts the authority short.
        ("postgres://u:hunter2/x@h/d", &["hunter2"]),
        ("postgres://u:12/hunter2@h/d", &["hunter2"]),
        ("postgres://u:pw@h/d?password=hun&ter2=x", &["ter2"]),
        ("postgres://u:hunter2@h:hunter2/d", &["hunter2"]),
        ("postgres://u:hunter2@h/d?sslmode=hunter2", &["hunter2"]),
        // Every part of a URL may hold a piece of a mis-encoded password.
        ("postgres://u:abc/LEAK4@h/d", &["LEAK4", "abc"]),
        ("postgres://u:pw@h/d?target_session_attrs=LEAK4", &["LEAK4"]),
        ("postgres://h/d?LEAK4", &["LEAK4"]),
        ("postgres://h/d?LEAK4=x", &["LEAK4"]),
        ("postgres://h/d?sslmode=LEAK4", &["LEAK4"]),
        ("postgres://h/d?connect_timeout=LEAK4", &["LEAK4"]),
        ("postgres://h:LEAK4/d", &["LEAK4"]),
        // A mistyped scheme makes the URL one key=value word without '='.
        ("postgres:/u:hunter2@h/d", &["hunter2"]),
        ("postgresql:u:hunter2@h/d", &["hunter2"]),
        ("postgres//u:hunter2@h/d", &["hunter2"]),
        // A stray word, not a parameter name, may be a password.
        ("host=h user=u hunter2", &["hunter2"]),
    ] {
        let e = s.parse::<ConnInfo>().expect_err(s).to_string();
        for secret in secrets {
            assert!(!e.contains(secret), "{s:?} -> {e:?} leaks {secret:?}");
        }
    }
}

#[test]
fn redaction() {
    let c = parse("postgres://walbox:hunter2@db:6543/app?sslmode=verify-ca&sslrootcert=/ca.pem");
    let r = c.redacted();
    assert!(!r.contains("hunter2"), "{r}");
    assert_eq!(
        r,
        "postgresql://walbox:***@db:6543/app?sslmode=verify-ca&sslrootcert=%2Fca.pem\
         &application_name=walbox"
    );
    assert_eq!(c.to_string(), r);
    let back = parse(&r);
    assert_eq!(back.password.as_deref(), Some("***"));
    assert_eq!(
        ConnInfo {
            password: c.password.clone(),
            ..back
        },
        c
    );
    let dbg = format!("{c:?}");
    assert!(!dbg.contains("hunter2") && dbg.contains("***"), "{dbg}");

    let unix = parse("host=/run/pg port=5444 user=u dbname='a b' connect_timeout=3");
    let r = unix.redacted();
    assert_eq!(
        r,
        "postgresql://u@%2Frun%2Fpg:5444/a%20b?sslmode=prefer&application_name=walbox\
         &connect_timeout=3"
    );
    assert_eq!(parse(&r), unix);
    let v6 = parse("postgres://u@[::1]/d");
    assert_eq!(parse(&v6.redacted()), v6);
}

// Several hosts and target_session_attrs (config::target).
#[test]
fn keyword_form_lists_hosts_and_ports() {
    let c = parse("host=a,b,/run/pg port=1,,3 user=u target_session_attrs=read-write");
    let hosts: Vec<String> = c.candidates().iter().map(|c| c.host_label()).collect();
    assert_eq!(hosts, ["a:1", "b:5432", "/run/pg:3"]);
    assert_eq!(c.target_session_attrs, SessionAttrs::ReadWrite);
    assert!(c.chooses_host());
    assert!(c
        .candidates()
        .iter()
        .all(|c| !c.chooses_host() || c.target_session_attrs != SessionAttrs::Any));
    assert!(c.candidates().iter().all(|c| c.more_hosts.is_empty()));

    let one_port = parse("host=a,b port=7 user=u");
    let hosts: Vec<String> = one_port
        .candidates()
        .iter()
        .map(|c| c.host_label())
        .collect();
    assert_eq!(hosts, ["a:7", "b:7"]);
}

#[test]
fn url_form_lists_hosts_with_their_ports() {
    let c = parse("postgresql://u:pw@a:1,[::1]:2,c/db?target_session_attrs=primary");
    let hosts: Vec<String> = c.candidates().iter().map(|c| c.host_label()).collect();
    assert_eq!(hosts, ["a:1", "[::1]:2", "c:5432"]);
    assert_eq!(c.target_session_attrs, SessionAttrs::Primary);
    assert!(c
        .candidates()
        .iter()
        .all(|c| c.password.as_deref() == Some("pw")));
    // The redacted form lists every host and parses back to the same targets.
    let r = c.redacted();
    assert!(
        r.starts_with("postgresql://u:***@a:1,[::1]:2,c:5432/db?"),
        "{r}"
    );
    assert!(r.contains("target_session_attrs=primary"), "{r}");
    let back = parse(&r);
    assert_eq!(back.candidates().len(), 3);
    assert_eq!(back.more_hosts, c.more_hosts);
}

#[test]
fn one_host_and_any_does_not_choose() {
    let c = parse("host=a user=u");
    assert!(!c.chooses_host());
    assert_eq!(c.candidates(), vec![c.clone()]);
    assert!(!c.redacted().contains("target_session_attrs"));
}

#[test]
fn mismatched_ports_and_unknown_attrs_are_errors() {
    let e = "host=a,b,c port=1,2 user=u"
        .parse::<ConnInfo>()
        .unwrap_err();
    assert!(e.to_string().contains("2 ports for 3 hosts"), "{e}");
    let e = "host=a user=u target_session_attrs=rw"
        .parse::<ConnInfo>()
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("\"rw\" is not one of any, read-write"),
        "{e}"
    );
    // After a password, or in a URL, the value is hidden as sslmode's and port's are.
    for s in [
        "host=a user=u password=p target_session_attrs=LEAK4",
        "postgres://u@a/d?target_session_attrs=LEAK4",
    ] {
        let e = s.parse::<ConnInfo>().unwrap_err().to_string();
        assert!(e.contains("target_session_attrs"), "{e}");
        assert!(e.contains("not one of any, read-write"), "{e}");
        assert!(!e.contains("LEAK4"), "{s:?} -> {e:?}");
    }
    let e = "host=a,,b user=u".parse::<ConnInfo>().unwrap_err();
    assert!(e.to_string().contains("an empty host"), "{e}");
}
