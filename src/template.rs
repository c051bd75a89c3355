//! The waiting page's template language: the languages the page speaks, its
//! phrase table (`assets/strings.json`), and parsing a page template with its
//! `{{placeholders}}`. It sits below `config` (which checks an operator's
//! template when the file is loaded) and `waiting` (which renders it).

use std::collections::BTreeMap;
use std::sync::LazyLock;

const STRINGS: &str = include_str!("../assets/strings.json");

/// The languages the page speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lang {
    En,
    Ko,
}

impl Lang {
    /// The BCP 47 code used in `lang` attributes and the `lang` query parameter.
    pub fn code(self) -> &'static str {
        match self {
            Lang::En => "en",
            Lang::Ko => "ko",
        }
    }

    /// `en`, `ko`, or a tag whose primary subtag is one of them (`ko-KR`).
    pub fn from_tag(tag: &str) -> Option<Lang> {
        let primary = tag.trim().split(['-', '_']).next().unwrap_or("");
        if primary.eq_ignore_ascii_case("en") {
            Some(Lang::En)
        } else if primary.eq_ignore_ascii_case("ko") {
            Some(Lang::Ko)
        } else {
            None
        }
    }

    /// The language the switch on the page offers.
    pub fn other(self) -> Lang {
        match self {
            Lang::En => Lang::Ko,
            Lang::Ko => Lang::En,
        }
    }
}

/// A page template that fails to parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    #[error("page template is missing required placeholder(s): {}", .0.join(", "))]
    Missing(Vec<&'static str>),
    #[error("page template uses {{{{{name}}}}} more than once (line {line}); it must appear once")]
    Repeated { name: &'static str, line: usize },
    #[error("page template has unknown placeholder {{{{{name}}}}} on line {line}")]
    Unknown { name: String, line: usize },
    #[error("page template opens a placeholder with {{{{ on line {line} and never closes it")]
    Unclosed { line: usize },
}

/// The values a template can ask for; see `assets/README.md`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Slot {
    Lang,
    State,
    Route,
    Title,
    Message,
    Headline,
    Lead,
    Position,
    Ahead,
    WaitingTotal,
    Eta,
    Progress,
    Updated,
    UpdatedIso,
    RefreshSeconds,
    RefreshUrl,
    RetryUrl,
    ReturnPath,
    StatusUrl,
    LeaveUrl,
    LangSwitchUrl,
    LangSwitchName,
    LangSwitchCode,
    StatusJson,
    Script,
    Style,
    LaneHidden,
    OpensAt,
    OpensIn,
}

const SLOTS: &[(&str, Slot)] = &[
    ("lang", Slot::Lang),
    ("state", Slot::State),
    ("route", Slot::Route),
    ("title", Slot::Title),
    ("message", Slot::Message),
    ("headline", Slot::Headline),
    ("lead", Slot::Lead),
    ("position", Slot::Position),
    ("ahead", Slot::Ahead),
    ("waiting_total", Slot::WaitingTotal),
    ("eta", Slot::Eta),
    ("progress", Slot::Progress),
    ("updated", Slot::Updated),
    ("updated_iso", Slot::UpdatedIso),
    ("refresh_seconds", Slot::RefreshSeconds),
    ("refresh_url", Slot::RefreshUrl),
    ("retry_url", Slot::RetryUrl),
    ("return_path", Slot::ReturnPath),
    ("status_url", Slot::StatusUrl),
    ("leave_url", Slot::LeaveUrl),
    ("lang_switch_url", Slot::LangSwitchUrl),
    ("lang_switch_name", Slot::LangSwitchName),
    ("lang_switch_code", Slot::LangSwitchCode),
    ("status_json", Slot::StatusJson),
    ("script", Slot::Script),
    ("style", Slot::Style),
    ("lane_hidden", Slot::LaneHidden),
    ("opens_at", Slot::OpensAt),
    ("opens_in", Slot::OpensIn),
];

/// Placeholders every template must contain exactly once (name, as written,
/// slot): without them the page can neither poll nor move on when the
/// visitor is admitted.
const REQUIRED: &[(&str, &str, Slot)] = &[
    ("status_json", "{{status_json}}", Slot::StatusJson),
    ("script", "{{script}}", Slot::Script),
];

#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Part {
    Text(String),
    Slot(Slot),
    /// `{{t:key}}`: a string of `assets/strings.json` in the page language.
    Phrase(String),
}

/// A parsed page template: text with `{{placeholders}}`.
#[derive(Clone, Debug, PartialEq)]
pub struct Template {
    pub(crate) parts: Vec<Part>,
}

impl Template {
    /// Parses a template, checking that every placeholder is known and the
    /// required ones (`{{status_json}}`, `{{script}}`) appear exactly once.
    pub fn parse(text: &str) -> Result<Template, TemplateError> {
        let mut parts = Vec::new();
        let mut rest = text;
        let mut line = 1;
        let mut seen: Vec<Slot> = Vec::new();
        while let Some(open) = rest.find("{{") {
            let (before, after_open) = rest.split_at(open);
            line += before.matches('\n').count();
            if !before.is_empty() {
                parts.push(Part::Text(before.to_owned()));
            }
            let inner_and_rest = &after_open[2..];
            let Some(close) = inner_and_rest.find("}}") else {
                return Err(TemplateError::Unclosed { line });
            };
            let name = inner_and_rest[..close].trim();
            if name.contains('\n') || name.contains("{{") {
                return Err(TemplateError::Unclosed { line });
            }
            if let Some(key) = name.strip_prefix("t:") {
                if phrase(Lang::En, key).is_none() {
                    return Err(TemplateError::Unknown {
                        name: name.to_owned(),
                        line,
                    });
                }
                parts.push(Part::Phrase(key.to_owned()));
            } else {
                let Some(&(_, slot)) = SLOTS.iter().find(|(n, _)| *n == name) else {
                    return Err(TemplateError::Unknown {
                        name: name.to_owned(),
                        line,
                    });
                };
                if let Some(&(required, _, _)) = REQUIRED.iter().find(|(_, _, s)| *s == slot) {
                    if seen.contains(&slot) {
                        return Err(TemplateError::Repeated {
                            name: required,
                            line,
                        });
                    }
                }
                seen.push(slot);
                parts.push(Part::Slot(slot));
            }
            rest = &inner_and_rest[close + 2..];
        }
        if !rest.is_empty() {
            parts.push(Part::Text(rest.to_owned()));
        }
        let missing: Vec<&'static str> = REQUIRED
            .iter()
            .filter(|(_, _, slot)| !seen.contains(slot))
            .map(|&(_, written, _)| written)
            .collect();
        if !missing.is_empty() {
            return Err(TemplateError::Missing(missing));
        }
        Ok(Template { parts })
    }
}

type Phrases = BTreeMap<String, BTreeMap<String, String>>;

/// `assets/strings.json`: language code → key → text.
pub(crate) static PHRASES: LazyLock<Phrases> =
    LazyLock::new(|| serde_json::from_str(STRINGS).unwrap_or_default());

pub(crate) fn phrase(lang: Lang, key: &str) -> Option<&'static str> {
    let table = &*PHRASES;
    table
        .get(lang.code())
        .and_then(|t| t.get(key))
        .or_else(|| table.get("en").and_then(|t| t.get(key)))
        .map(String::as_str)
}
