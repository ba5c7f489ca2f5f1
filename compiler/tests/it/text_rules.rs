//! Transcript cleaning, one row per rule (README.md "Text cleaning").

use asr_compiler::{clean_transcript as clean, strip_language_tag, with_language_tag};

#[test]
fn each_cleaning_rule() {
    for (rule, input, want) in [
        ("bracket tags", "[laugh] hello [music]world", "hello world"),
        ("tags with spaces and digits", "[2 speakers] नमस्ते [singing]", "नमस्ते"),
        ("a tag does not span lines", "[a\nb] x", "a b x"),
        (
            "latin punctuation",
            "Hello, world! How's it going? Fine; thanks: (really).",
            "Hello world Hows it going Fine thanks really",
        ),
        ("danda and double danda", "नमस्ते। आप कैसे हैं॥", "नमस्ते आप कैसे हैं"),
        (
            "curly quotes, ellipsis, dashes",
            "“Yes”… she said — ‘no’ – fine ‐ ok",
            "Yes she said no fine ok",
        ),
        ("guillemets and inverted marks", "«hola» ¿qué? ¡sí! a·b", "hola qué sí ab"),
        ("fullwidth and CJK punctuation", "你好，世界！（测试）。", "你好世界测试"),
        (
            "symbols the pipeline lists",
            "50% of 3/4 + x = $5 * @home #tag & a_b ^ <a> | \\ ` ~",
            "50 of 34 x 5 home tag ab a",
        ),
        ("digits and case kept", "Room 101 IS Open", "Room 101 IS Open"),
        ("hyphenated words join, as the pipeline does", "well-known e-mail", "wellknown email"),
        ("unicode whitespace collapses", "  a \t\n b\u{00A0}\u{2003}c  ", "a b c"),
        ("zero-width joiner kept", "क्\u{200D}ष", "क्\u{200D}ष"),
        ("combining marks kept", "ஆங்கிலம்", "ஆங்கிலம்"),
        ("nothing left", "[noise] ... !!! —", ""),
    ] {
        assert_eq!(clean(input), want, "rule: {rule}");
    }
}

#[test]
fn language_tags_are_stripped_and_added() {
    assert_eq!(strip_language_tag("<|hi|> नमस्ते"), (Some("hi"), "नमस्ते"));
    assert_eq!(strip_language_tag("<|en|>hello"), (Some("en"), "hello"));
    assert_eq!(strip_language_tag("  <|mr|>   आहे"), (Some("mr"), "आहे"));
    assert_eq!(strip_language_tag("no tag"), (None, "no tag"));
    assert_eq!(strip_language_tag("<||> x"), (None, "<||> x"));
    assert_eq!(strip_language_tag("<|a b|> x"), (None, "<|a b|> x"));
    assert_eq!(with_language_tag("ta", "வணக்கம்"), "<|ta|> வணக்கம்");
}
