use super::*;

#[test]
fn plain_json_accepts_only_what_serde_reads_as_the_same_value() {
    let accepted = [
        r#"{"load":"@0000000000000000","pad":"xxxx"}"#,
        r#"{}"#,
        r#"[]"#,
        r#"[ 1 , -0 , 0.5 , -12.25e+10 , 3E-2 , 1e400 , 123456789012345678901234567890 ]"#,
        "{ \"a\" : [ true , false , null ] , \"a\" : { \"b\" : \"\u{7f}\u{e9}\u{1f600}\" } }",
        "\"x\"",
        "0",
        "null",
        "{\"n\":[1,{\"t\":\"\t\"}]}",
        "\"a\\nb\"",
    ];
    for text in accepted {
        let expected = serde_json::from_str::<&RawValue>(text).map(|r| r.get().to_owned());
        if plain_json(text.as_bytes()) {
            assert_eq!(expected.ok().as_deref(), Some(text), "{text}");
        } else {
            // Only escapes and control characters are left to serde on purpose.
            assert!(
                text.contains('\\') || text.bytes().any(|b| b < 0x20),
                "{text}"
            );
        }
    }
    let refused = [
        "",
        " 1",
        "1 ",
        "01",
        "-",
        "1.",
        ".5",
        "1e",
        "+1",
        "nul",
        "truex",
        "[1,]",
        "{,}",
        "{\"a\"}",
        "{\"a\":}",
        "{1:2}",
        "[1 2]",
        "\"a\u{1}\"",
        "\"open",
        "{\"a\":1",
        "[",
        "}",
        "1}",
        "[1]]",
    ];
    for text in refused {
        assert!(!plain_json(text.as_bytes()), "{text:?}");
    }
    let nested = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
    assert!(plain_json(nested(PAYLOAD_DEPTH_FAST_MAX).as_bytes()));
    assert!(!plain_json(nested(PAYLOAD_DEPTH_FAST_MAX + 1).as_bytes()));
}

/// `plain_json` against its definition, on generated JSON and on near misses (one or two
/// bytes replaced, removed or doubled): exactly what `serde_json` reads as one value
/// spanning the whole text, without a backslash anywhere, at most `PAYLOAD_DEPTH_FAST_MAX`
/// deep.
#[test]
fn plain_json_agrees_with_its_definition_on_generated_text() {
    let definition = |text: &str| {
        serde_json::from_str::<&RawValue>(text).is_ok_and(|raw| raw.get() == text)
            && !text.contains('\\')
            && json_depth(text) <= PAYLOAD_DEPTH_FAST_MAX
    };
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move |n: usize| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % n as u64) as usize
    };
    fn value(out: &mut String, depth: usize, next: &mut impl FnMut(usize) -> usize) {
        const SPACE: [&str; 6] = ["", "", "", " ", "\n\t", "\r "];
        const SCALARS: [&str; 14] = [
            "0",
            "-0",
            "12",
            "-3.25",
            "1e9",
            "2E-7",
            "4.5e+1",
            "true",
            "false",
            "null",
            "\"\"",
            "\"ab\"",
            "\"long string of text, past a word\"",
            "\"\u{e9}\u{1f600}\"",
        ];
        let kind = if depth == 0 { 2 } else { next(4) };
        match kind {
            0 | 1 => {
                let (open, close) = if kind == 0 { ('[', ']') } else { ('{', '}') };
                out.push(open);
                out.push_str(SPACE[next(SPACE.len())]);
                for item in 0..next(4) {
                    if item > 0 {
                        out.push(',');
                        out.push_str(SPACE[next(SPACE.len())]);
                    }
                    if kind == 1 {
                        out.push_str(["\"k\"", "\"\"", "\"key name\""][next(3)]);
                        out.push_str(SPACE[next(SPACE.len())]);
                        out.push(':');
                        out.push_str(SPACE[next(SPACE.len())]);
                    }
                    value(out, depth - 1, next);
                    out.push_str(SPACE[next(SPACE.len())]);
                }
                out.push(close);
            }
            _ => out.push_str(SCALARS[next(SCALARS.len())]),
        }
    }
    const BYTES: &[u8] = b"{}[],:\"\\ \t01-.eE+tfn\x01x";
    let (mut accepted, mut refused) = (0, 0);
    for round in 0..60_000 {
        let mut text = String::new();
        value(&mut text, 1 + next(4), &mut next);
        let mut bytes = text.into_bytes();
        for _ in 0..round % 3 {
            if bytes.is_empty() {
                break;
            }
            let at = next(bytes.len());
            match next(3) {
                0 => bytes[at] = BYTES[next(BYTES.len())],
                1 => drop(bytes.remove(at)),
                _ => bytes.insert(at, bytes[at]),
            }
        }
        // Mutations may split a multibyte character; only text reaches the scanner.
        let Ok(text) = String::from_utf8(bytes) else {
            continue;
        };
        let plain = plain_json(text.as_bytes());
        assert_eq!(plain, definition(&text), "{text:?}");
        if plain {
            accepted += 1;
        } else {
            refused += 1;
        }
    }
    // Both answers come up often, so the comparison means something.
    assert!(
        accepted > 10_000 && refused > 10_000,
        "{accepted} {refused}"
    );
    for text in [
        "[".repeat(100) + &"]".repeat(100),
        "[".repeat(101) + &"]".repeat(101),
        "{\"a\":".repeat(100) + "1" + &"}".repeat(100),
        "{\"a\":".repeat(101) + "1" + &"}".repeat(101),
    ] {
        assert_eq!(plain_json(text.as_bytes()), definition(&text));
    }
}

#[test]
fn json_depth_counts_containers_not_brackets_in_strings() {
    assert_eq!(json_depth("1"), 0);
    assert_eq!(json_depth(r#""[{""#), 0);
    assert_eq!(json_depth("{}"), 1);
    assert_eq!(json_depth(r#"[{"a":[1]},{"b":2}]"#), 3);
    assert_eq!(json_depth(r#"{"a":"\\\"[[[","b":{}}"#), 2);
    let nested = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
    assert_eq!(json_depth(&nested(200)), 200);
}

#[test]
fn first_special_matches_a_byte_loop() {
    let slow = |b: &[u8]| b.iter().position(|&c| c == b'"' || c == b'\\' || c < 0x20);
    // Every position of every kind of special byte, among bytes on both sides of each
    // threshold (0x1f/0x20, 0x21/0x22/0x23, 0x5b/0x5c/0x5d, 0x7f/0x80, 0xff).
    let fill = [b'a', 0x20, 0x21, 0x23, 0x5b, 0x5d, 0x7f, 0x80, 0xa0, 0xff];
    let special = [b'"', b'\\', 0x00, 0x01, 0x1f];
    // Every length across the words (to 40), the 64-byte blocks (to 104) and the 32-byte
    // block (to 136), and a few beyond.
    for len in (0..=140).chain([167, 168, 169, 170, 171, 200]) {
        for &f in &fill {
            let base = vec![f; len];
            assert_eq!(first_special(&base), slow(&base));
            for at in 0..len {
                for &sp in &special {
                    let mut b = base.clone();
                    b[at] = sp;
                    assert_eq!(first_special(&b), slow(&b), "{b:02x?}");
                    // A second special byte after the first never changes the answer.
                    if at + 1 < len {
                        b[len - 1] = 0x00;
                        assert_eq!(first_special(&b), slow(&b), "{b:02x?}");
                    }
                }
            }
        }
    }
}

#[test]
fn classifies_requests_notifications_and_responses() {
    let m =
        parse(br#"{"jsonrpc":"2.0","id":7,"method":"ping","params":{"channel":"ahp-root://"}}"#);
    match m {
        Ok(Message::Request { id, method, params }) => {
            assert_eq!(id.get(), "7");
            assert_eq!(method, "ping");
            assert_eq!(
                params.map(|p| p.get()),
                Some(r#"{"channel":"ahp-root://"}"#)
            );
        }
        other => panic!("unexpected {other:?}"),
    }
    assert!(matches!(
        parse(br#"{"jsonrpc":"2.0","method":"unsubscribe"}"#),
        Ok(Message::Notification { .. })
    ));
    assert!(matches!(
        parse(br#"{"jsonrpc":"2.0","id":null,"method":"x"}"#),
        Ok(Message::Request { .. })
    ));
    assert!(matches!(
        parse(br#"{"jsonrpc":"2.0","id":3,"result":null}"#),
        Ok(Message::Response { outcome: Ok(_), .. })
    ));
    assert!(matches!(
        parse(br#"{"jsonrpc":"2.0","id":3,"error":{"code":1,"message":"m"}}"#),
        Ok(Message::Response {
            outcome: Err(_),
            ..
        })
    ));
}

#[test]
fn method_names_with_escapes_are_unescaped() {
    match parse(br#"{"jsonrpc":"2.0","id":"a","method":"p\u0069ng"}"#) {
        Ok(Message::Request { method, id, .. }) => {
            assert_eq!(method, "ping");
            assert_eq!(id.get(), "\"a\"");
        }
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn rejects_what_is_not_json_rpc() {
    assert_eq!(parse(b"{nope").unwrap_err(), Malformed::NotJson);
    assert_eq!(parse(b"").unwrap_err(), Malformed::NotJson);
    assert!(matches!(parse(b"[1,2]"), Err(Malformed::NotJsonRpc(_))));
    assert!(matches!(parse(b"42"), Err(Malformed::NotJsonRpc(_))));
    assert!(matches!(
        parse(br#"{"id":1,"method":"ping"}"#),
        Err(Malformed::NotJsonRpc(_))
    ));
    assert!(matches!(
        parse(br#"{"jsonrpc":"1.0","id":1,"method":"ping"}"#),
        Err(Malformed::NotJsonRpc(_))
    ));
    assert!(matches!(
        parse(br#"{"jsonrpc":"2.0","id":{},"method":"ping"}"#),
        Err(Malformed::NotJsonRpc(_))
    ));
    assert!(matches!(
        parse(br#"{"jsonrpc":"2.0","id":1,"method":"a","method":"b"}"#),
        Err(Malformed::NotJsonRpc(_))
    ));
}

#[test]
fn ids_must_be_strict_json() {
    for id in ["1e400", "-1e400", r#""\ud800""#, r#""a\udc00b""#] {
        let text = format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"ping"}}"#);
        assert_eq!(
            parse(text.as_bytes()).unwrap_err(),
            Malformed::NotJsonRpc("Invalid JSON-RPC request: bad id"),
            "{id}"
        );
    }
    for id in [
        "0",
        "-1.5e300",
        "123456789012345678901234567890",
        r#""\ud83d\ude00""#,
    ] {
        let text = format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"ping"}}"#);
        assert!(
            matches!(parse(text.as_bytes()), Ok(Message::Request { .. })),
            "{id}"
        );
    }
}

#[test]
fn text_that_is_not_json_is_a_parse_error_even_after_a_wrong_type() {
    // serde meets the wrong type (or a duplicate key) before the broken syntax.
    for text in [
        r#"{"jsonrpc":5,"#,
        r#"{"method":{"a"}}"#,
        r#"{"method":1,"id":}"#,
        r#"{"id":1,"id":2,"#,
    ] {
        assert_eq!(
            parse(text.as_bytes()).unwrap_err(),
            Malformed::NotJson,
            "{text}"
        );
    }
    assert!(matches!(
        parse(br#"{"jsonrpc":5}"#),
        Err(Malformed::NotJsonRpc(_))
    ));
}

#[test]
fn compact_notifies_are_read_in_one_pass() {
    let text = r#"{"jsonrpc":"2.0","method":"clientService/notify","params":{"channel":"x-client-services://","serviceId":"s1","method":"tick","params":{"n":[1,2]}}}"#;
    let n = parse_compact_notify(text).expect("compact notify");
    let text = text.to_owned();
    assert_eq!(n.channel, "x-client-services://");
    assert_eq!(n.service_id, "s1");
    assert_eq!(n.method, "tick");
    assert_eq!(n.params.get(), r#"{"n":[1,2]}"#);
    // Trailing whitespace is still one message.
    let mut spaced = text;
    spaced.push_str(" \n");
    assert!(parse_compact_notify(&spaced).is_some());
}

#[test]
fn the_canonical_layout_agrees_with_the_serde_reader() {
    let head = r#"{"jsonrpc":"2.0","method":"clientService/notify","params":{"channel":"x-client-services://","serviceId":""#;
    for (id, method, payload, tail) in [
        ("s1", "tick", r#"{"a":[1,{"b":"}}"}]}"#, "}}"),
        ("s1", "t", "1", "}} \n"),
        ("\u{e9}t\u{e9}", "m", r#""x""#, "}}"),
        ("s1", "m", "[1 ]", "}}"),
        ("s1", "m", "null", "}}"),
    ] {
        let text = format!(r#"{head}{id}","method":"{method}","params":{payload}{tail}"#);
        let fast = canonical_notify(&text).expect("canonical");
        let slow: NotifyMessage<'_> = serde_json::from_str(&text).expect("serde");
        assert_eq!(fast.service_id, slow.params.service_id);
        assert_eq!(fast.method, slow.params.method);
        assert_eq!(fast.channel, slow.params.channel);
        assert_eq!(fast.params.get(), slow.params.params.get());
    }
    // Escapes, control characters, a payload followed by more members, deep payloads and
    // trailing garbage are left to serde.
    let deep = format!(
        "{}{}",
        "[".repeat(PAYLOAD_DEPTH_FAST_MAX + 1),
        "]".repeat(PAYLOAD_DEPTH_FAST_MAX + 1)
    );
    for (id, payload, tail) in [
        (r"s\u0031", "1", "}}"),
        ("s\u{1}", "1", "}}"),
        ("s1", r#"1,"x":2"#, "}}"),
        ("s1", deep.as_str(), "}}"),
        ("s1", "1", "}}x"),
        ("s1", "1", "} }"),
        ("s1", "1 1", "}}"),
    ] {
        let text = format!(r#"{head}{id}","method":"m","params":{payload}{tail}"#);
        assert!(canonical_notify(&text).is_none(), "{text}");
    }
}

#[test]
fn anything_but_a_plain_compact_notify_takes_the_general_path() {
    let p = r#"{"channel":"x-client-services://","serviceId":"s1","method":"tick","params":1}"#;
    for text in [
        // A request, not a notification.
        format!(r#"{{"jsonrpc":"2.0","method":"clientService/notify","params":{p},"id":1}}"#),
        format!(r#"{{"jsonrpc":"2.0","method":"clientService/notify","id":1,"params":{p}}}"#),
        // Unknown and duplicate members.
        format!(r#"{{"jsonrpc":"2.0","method":"clientService/notify","params":{p},"x":1}}"#),
        format!(r#"{{"jsonrpc":"2.0","method":"clientService/notify","params":{p},"params":{p}}}"#),
        format!(
            r#"{{"jsonrpc":"2.0","method":"clientService/notify","method":"ping","params":{p}}}"#
        ),
        // Another layout.
        format!(r#"{{"method":"clientService/notify","jsonrpc":"2.0","params":{p}}}"#),
        format!(r#"{{ "jsonrpc":"2.0","method":"clientService/notify","params":{p}}}"#),
        // Params the notify path refuses, trailing garbage, a cut.
        r#"{"jsonrpc":"2.0","method":"clientService/notify","params":null}"#.to_owned(),
        format!(r#"{{"jsonrpc":"2.0","method":"clientService/notify","params":{p}}}x"#),
        format!(r#"{{"jsonrpc":"2.0","method":"clientService/notify","params":{p}"#),
    ] {
        assert!(parse_compact_notify(&text).is_none(), "{text}");
    }
}

#[test]
fn frames_are_valid_json() {
    let f = error_frame("null", &RpcError::new(-32700, "Invalid \"JSON\""));
    let v: Value = serde_json::from_slice(f.as_bytes()).expect("json");
    assert_eq!(v["error"]["code"], -32700);
    assert!(v["id"].is_null());
    let f = notification_frame("action", r#"{"a":1}"#);
    let v: Value = serde_json::from_slice(f.as_bytes()).expect("json");
    assert_eq!(v["params"]["a"], 1);
}
