//! The closed vocabulary shared by several tasks: people and their pronouns.
//!
//! Short, common, mostly one-token names keep prompts short and the tokenizer small. Each
//! name has a fixed grammatical gender so templates can say "she"/"he" consistently; the
//! models never have to infer it (the pronoun never decides an answer).

/// A person's name with the pronouns the templates need.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Person {
    /// First name, capitalised.
    pub name: &'static str,
    /// Subject pronoun, capitalised for sentence starts: "She"/"He".
    pub subject: &'static str,
    /// Subject pronoun mid-sentence: "she"/"he".
    pub subject_lc: &'static str,
    /// Possessive: "her"/"his".
    pub possessive: &'static str,
}

const fn she(name: &'static str) -> Person {
    Person {
        name,
        subject: "She",
        subject_lc: "she",
        possessive: "her",
    }
}

const fn he(name: &'static str) -> Person {
    Person {
        name,
        subject: "He",
        subject_lc: "he",
        possessive: "his",
    }
}

/// The 24 people of the suite (12 + 12).
pub const PEOPLE: [Person; 24] = [
    she("Anna"),
    she("Cara"),
    she("Emma"),
    she("Gina"),
    she("Ida"),
    she("Kate"),
    she("Mia"),
    she("Olga"),
    she("Rosa"),
    she("Tina"),
    she("Uma"),
    she("Wendy"),
    he("Ben"),
    he("Dan"),
    he("Finn"),
    he("Hugo"),
    he("Jack"),
    he("Leo"),
    he("Max"),
    he("Nick"),
    he("Paul"),
    he("Sam"),
    he("Tom"),
    he("Vic"),
];
