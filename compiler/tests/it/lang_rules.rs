//! Language normalisation and retagging rules, one table row per rule.

use asr_compiler::{
    decide_language as decide, dominant_script, normalize_language as normalize, Method, Script,
};

#[test]
fn codes_normalise_to_iso_639_1() {
    for (label, code, known) in [
        ("HI", "hi", true),
        ("hin", "hi", true),
        ("hi-IN", "hi", true),
        ("hi_IN", "hi", true),
        (" Hindi ", "hi", true),
        ("Marathi", "mr", true),
        ("mar", "mr", true),
        ("Bangla", "bn", true),
        ("ben", "bn", true),
        ("asm", "as", true),
        ("Odia", "or", true),
        ("ory", "or", true),
        ("Oriya", "or", true),
        ("pan", "pa", true),
        ("en-US", "en", true),
        ("ENG", "en", true),
        ("ta", "ta", true),
        ("xx-YY", "xx", false),
        ("Klingon", "klingon", false),
    ] {
        let c = normalize(label);
        assert_eq!((c.code.as_str(), c.known), (code, known), "{label:?}");
    }
}

#[test]
fn scripts_are_counted_over_letters() {
    assert_eq!(dominant_script("வணக்கம் 123 !!").map(|s| s.0), Some(Script::Tamil));
    assert_eq!(dominant_script("hello world").map(|s| (s.0, s.1)), Some((Script::Latin, 1.0)));
    assert_eq!(dominant_script("123 ।"), None);
    let (s, share) = dominant_script("मैं office जा रहा हूँ").unwrap();
    assert_eq!(s, Script::Devanagari);
    assert!(share < 0.8, "code-switched text: {share}");
}

#[test]
fn single_language_scripts_retag_whatever_the_label() {
    for (label, text, want) in [
        ("hi", "வணக்கம் எப்படி இருக்கிறீர்கள்", "ta"),
        ("hi", "నమస్కారం మీరు ఎలా ఉన్నారు", "te"),
        ("te", "ನಮಸ್ಕಾರ ನೀವು ಹೇಗಿದ್ದೀರಿ", "kn"),
        ("ta", "നമസ്കാരം സുഖമാണോ", "ml"),
        ("hi", "નમસ્તે તમે કેમ છો", "gu"),
        ("hi", "ਸਤ ਸ੍ਰੀ ਅਕਾਲ ਤੁਸੀਂ ਕਿਵੇਂ ਹੋ", "pa"),
        ("bn", "ନମସ୍କାର ଆପଣ କେମିତି ଅଛନ୍ତି", "or"),
        ("hi", "good morning how are you", "en"),
    ] {
        let d = decide(label, text);
        assert_eq!(d.language, want, "{text}");
        assert!(d.retagged);
        assert_eq!(d.method, Some(Method::Script));
        assert!(d.confidence >= 0.8);
    }
    // A correct label stays, recorded as confirmed by the script.
    let d = decide("ta", "வணக்கம்");
    assert_eq!((d.language.as_str(), d.retagged), ("ta", false));
}

#[test]
fn bengali_script_uses_assamese_and_bengali_letters() {
    // ৰ and ৱ are Assamese only; র is Bengali only.
    let d = decide("bn", "মই অসমীয়া ভাষাত কথা কওঁ আৰু গান গাওঁ");
    assert_eq!((d.language.as_str(), d.method), ("as", Some(Method::ScriptLetters)));
    let d = decide("as", "আমি বাংলায় কথা বলি এবং আমার বাড়ি কলকাতায়");
    assert_eq!((d.language.as_str(), d.method), ("bn", Some(Method::ScriptLetters)));
    // Neither letter: the label stands if it is a Bengali-script language.
    let d = decide("as", "আমি তোমাকে দেখি");
    assert_eq!((d.language.as_str(), d.retagged, d.method), ("as", false, None));
    // A label from another script is wrong whatever the evidence: the script's main language.
    let d = decide("ta", "আমি তোমাকে দেখি");
    assert_eq!((d.language.as_str(), d.retagged), ("bn", true));
}

#[test]
fn devanagari_uses_language_identification_and_keeps_unconfident_labels() {
    let hindi = [
        "मैं आज बाजार जा रहा हूँ क्योंकि घर में सब्जियां खत्म हो गई हैं और शाम को मेहमान आने वाले हैं",
        "उसने कहा कि वह कल सुबह जल्दी उठकर स्टेशन जाएगा और अपनी बहन को लेकर आएगा",
    ];
    let marathi = [
        "मी आज बाजारात जात आहे कारण घरातल्या भाज्या संपल्या आहेत आणि संध्याकाळी पाहुणे येणार आहेत",
        "तो म्हणाला की उद्या सकाळी लवकर उठून तो स्टेशनवर जाईल आणि त्याच्या बहिणीला घेऊन येईल",
    ];
    let mut retagged = 0;
    for (text, truth, wrong) in
        hindi.iter().map(|t| (t, "hi", "mr")).chain(marathi.iter().map(|t| (t, "mr", "hi")))
    {
        let d = decide(wrong, text);
        // Never moved to a wrong language: either corrected, or kept for lack of confidence.
        assert!(
            (d.language == truth && d.method == Some(Method::Lid))
                || (d.language == wrong && !d.retagged),
            "{text}: {d:?}"
        );
        retagged += usize::from(d.retagged);
        // The right label is never changed.
        let d = decide(truth, text);
        assert_eq!(d.language, truth, "{text}: {d:?}");
    }
    assert!(retagged >= 2, "language identification corrected only {retagged} of 4 rows");
    // Code-switched text (under 80% Devanagari letters) keeps its label.
    let d = decide("mr", "मैं office जा रहा हूँ");
    assert_eq!((d.language.as_str(), d.retagged), ("mr", false));
    // Devanagari labelled with a language of another script: corrected in any case.
    let d = decide("ta", hindi[0]);
    assert!(d.retagged && ["hi", "mr", "ne"].contains(&d.language.as_str()), "{d:?}");
}

#[test]
fn latin_script_keeps_a_label_of_another_latin_language() {
    // FLEURS and Common Voice label French, German, ...: Latin script does not decide between
    // them, so the label stands; a label of another script still becomes English.
    for (label, text) in [("fr", "bonjour le monde"), ("de", "guten Tag"), ("es", "¿qué tal?")] {
        let d = decide(label, text);
        assert_eq!((d.language.as_str(), d.retagged), (label, false), "{label}");
    }
    let d = decide("hi", "hello world");
    assert_eq!((d.language.as_str(), d.retagged), ("en", true));
    assert_eq!(normalize("French").code, "fr");
    assert_eq!(normalize("de-DE").code, "de");
    assert!(normalize("German").known);
}
