"""Generate the course's MRPC-shaped paraphrase corpus from templates.

Used by ``data/build_assets.py``; everything here is deterministic given a
``random.Random``.

An *event* is a frame ("a company bought another company") with its slots filled
("Norbridge Systems", "Alder Foods", "$40 million") plus a polarity: the frame's
plain statement, its negation, or its opposite ("sold" instead of "bought").
A sentence is one rendering of an event: the frame offers several templates that
say the same thing (synonyms, active or passive voice), each slot value has
several spellings ("$40 million", "40 million dollars"), the date can open or
close the sentence, and an attribution ("officials said") may be added.

- A paraphrase pair renders the same event twice.
- A non-paraphrase pair renders an event and a changed copy of it: negated,
  opposite verb, swapped roles, another entity, another number, another date,
  or an unrelated event.

Then about 5% of the labels are flipped, as real annotations are noisy.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

# ---------------------------------------------------------------------------
# Lexicon. Each category is a list of values; each value is a tuple of
# spellings that mean the same thing (the first one is the canonical one).
# Some values share a word ("Alder Foods", "Alder Energy") so that changing an
# entity sometimes changes a single word: the hardest non-paraphrases.
# ---------------------------------------------------------------------------

_COMPANY_NAMES = [
    "Norbridge Systems", "Norbridge Energy", "Alder Foods", "Alder Motors",
    "Kestrel Motors", "Kestrel Software", "Brightwater Energy", "Halden Pharma",
    "Corvus Airlines", "Lumina Software", "Redfield Bank", "Redfield Foods",
    "Orchard Telecom", "Summit Steel", "Bluestone Pharma", "Westmark Bank",
]
# "Norbridge Systems" can also be written "Norbridge Systems Inc.".
COMPANIES = [(name, f"{name} Inc.") for name in _COMPANY_NAMES]

_TEAM_NAMES = [
    ("Rivertown", "Hawks"), ("Eastport", "Lions"), ("Millbrook", "Falcons"),
    ("Granville", "Bears"), ("Rivertown", "Rangers"), ("Eastport", "Wolves"),
    ("Lakeside", "Hawks"), ("Fairview", "Tigers"),
]
TEAMS = [(f"the {town} {mascot}", f"the {mascot} of {town}") for town, mascot in _TEAM_NAMES]

_FIRST_NAMES = [
    ("Maria", "Ms."), ("James", "Mr."), ("Anna", "Ms."), ("David", "Mr."),
    ("Laura", "Ms."), ("Peter", "Mr."), ("Sarah", "Ms."), ("Thomas", "Mr."),
    ("Helen", "Ms."), ("Robert", "Mr."),
]
_LAST_NAMES = [
    "Lopez", "Chen", "Miller", "Novak", "Okafor", "Russo",
    "Schmidt", "Tanaka", "Walsh", "Hughes",
]
PEOPLE = [
    (f"{first} {last}", f"{title} {last}")
    for first, title in _FIRST_NAMES
    for last in _LAST_NAMES
]

BODIES = [
    ("the city council", "the council"),
    ("the state senate", "state senators"),
    ("the board of directors", "the company's board"),
    ("federal regulators", "regulators in Washington"),
    ("the school board", "school board members"),
    ("the planning commission", "the city planning commission"),
]

PROPOSALS = [
    ("the new budget", "the budget for next year"),
    ("a plan to build a new bridge", "plans for a new bridge"),
    ("a ban on plastic bags", "a plastic bag ban"),
    ("a tax on sugary drinks", "a soda tax"),
    ("a higher minimum wage", "an increase in the minimum wage"),
    ("the airport expansion", "the plan to expand the airport"),
    ("the new school calendar", "changes to the school calendar"),
    ("a plan to build a new stadium", "plans for a new stadium"),
]

CITIES = [
    (city,) for city in (
        "Boston", "Denver", "Toronto", "Seattle", "Chicago", "Dallas",
        "Atlanta", "Portland", "Phoenix", "Miami", "Detroit", "Houston",
    )
]

TITLES = [
    ("chief executive", "CEO"),
    ("chief financial officer", "finance chief"),
    ("chairman", "chairman of the board"),
    ("president", "president"),
    ("chief operating officer", "COO"),
]

FACILITIES = [
    ("factory", "plant"),
    ("store", "shop"),
    ("research center", "research lab"),
    ("warehouse", "distribution center"),
    ("office", "office"),
]

UNIVERSITIES = [
    (name,) for name in (
        "Harwell University", "the University of Eastport", "Millbrook College",
        "the Granville Institute", "Harwell Medical School",
    )
]

FINDINGS = [
    ("a new species of frog", "a previously unknown frog species"),
    ("a gene linked to diabetes", "a gene tied to diabetes"),
    ("a cheaper way to make hydrogen", "a less expensive way to produce hydrogen"),
    ("signs of water on Mars", "evidence of water on Mars"),
    ("a new treatment for asthma", "a new asthma treatment"),
    ("the fossil of an early bird", "a fossil of an early bird"),
    ("a gene linked to asthma", "a gene tied to asthma"),
]

QUARTERS = [(q,) for q in ("first", "second", "third", "fourth")]

# Amounts in millions of dollars.
MONEY = [(f"${n} million", f"{n} million dollars") for n in (12, 15, 20, 25, 40, 60, 75, 90, 120, 150, 200, 340, 500, 750)]
PERCENTS = [(f"{n} percent", f"{n}%") for n in range(2, 31)]
JOB_COUNTS = [(n,) for n in ("50", "120", "200", "300", "450", "600", "800", "1,200", "2,500")]
SCORES = [(f"{a}-{b}", f"by a score of {a}-{b}") for a in range(1, 7) for b in range(0, a)]
DATES = [(f"on {day}",) for day in ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday")] + [
    (f"in {month}",) for month in ("January", "March", "May", "August", "October", "December")
]

CATEGORIES: dict[str, list[tuple[str, ...]]] = {
    "company": COMPANIES,
    "team": TEAMS,
    "person": PEOPLE,
    "body": BODIES,
    "proposal": PROPOSALS,
    "city": CITIES,
    "title": TITLES,
    "facility": FACILITIES,
    "university": UNIVERSITIES,
    "finding": FINDINGS,
    "quarter": QUARTERS,
    "money": MONEY,
    "percent": PERCENTS,
    "jobs": JOB_COUNTS,
    "score": SCORES,
}
NUMBER_CATEGORIES = {"money", "percent", "jobs", "score"}

ATTRIBUTIONS = ["officials said", "a spokesman said", "the report said", "sources said", "the newspaper reported"]


@dataclass(frozen=True)
class Frame:
    """One kind of event and the templates that express it.

    ``says``, ``denies`` and ``opposite`` hold templates with ``{slot}`` fields;
    templates within one tuple are paraphrases of one another. ``swappable`` names
    two slots of the same category whose exchange changes the meaning.
    """

    name: str
    slots: dict[str, str]
    says: tuple[str, ...]
    denies: tuple[str, ...]
    opposite: tuple[str, ...]
    swappable: tuple[str, str] | None = None
    dated: bool = True


FRAMES = [
    Frame(
        "acquisition",
        {"A": "company", "B": "company", "M": "money"},
        says=(
            "{A} bought {B} for {M}",
            "{A} acquired {B} for {M}",
            "{B} was bought by {A} for {M}",
            "{B} was acquired by {A} in a deal worth {M}",
            "{A} purchased {B} for {M}",
        ),
        denies=(
            "{A} did not buy {B} for {M}",
            "{A} did not acquire {B} for {M}",
            "{B} was not bought by {A} for {M}",
        ),
        opposite=(
            "{A} sold {B} for {M}",
            "{B} was sold by {A} for {M}",
            "{A} sold its stake in {B} for {M}",
        ),
        swappable=("A", "B"),
    ),
    Frame(
        "match",
        {"A": "team", "B": "team", "S": "score"},
        says=(
            "{A} beat {B} {S}",
            "{A} defeated {B} {S}",
            "{B} lost to {A} {S}",
            "{B} were beaten by {A} {S}",
            "{A} won {S} against {B}",
        ),
        denies=(
            "{A} did not beat {B} {S}",
            "{B} were not beaten by {A} {S}",
        ),
        opposite=(
            "{A} lost to {B} {S}",
            "{A} were beaten by {B} {S}",
            "{B} defeated {A} {S}",
        ),
        swappable=("A", "B"),
    ),
    Frame(
        "lawsuit",
        {"A": "company", "B": "company", "M": "money"},
        says=(
            "{A} sued {B} for {M}",
            "{A} filed a lawsuit against {B} seeking {M}",
            "{B} was sued by {A} for {M}",
            "{A} took {B} to court, seeking {M}",
        ),
        denies=(
            "{A} did not sue {B} for {M}",
            "{B} was not sued by {A} for {M}",
        ),
        opposite=(
            "{A} settled its dispute with {B} for {M}",
            "{A} dropped its lawsuit against {B} seeking {M}",
        ),
        swappable=("A", "B"),
    ),
    Frame(
        "vote",
        {"A": "body", "B": "proposal"},
        says=(
            "{A} approved {B}",
            "{A} voted to approve {B}",
            "{A} backed {B}",
            "{B} was approved by {A}",
            "{A} gave final approval to {B}",
        ),
        denies=(
            "{A} did not approve {B}",
            "{B} was not approved by {A}",
            "{A} failed to approve {B}",
        ),
        opposite=(
            "{A} rejected {B}",
            "{A} voted against {B}",
            "{B} was rejected by {A}",
            "{A} blocked {B}",
        ),
    ),
    Frame(
        "layoffs",
        {"A": "company", "N": "jobs"},
        says=(
            "{A} cut {N} jobs",
            "{A} eliminated {N} jobs",
            "{A} said it would cut {N} jobs",
            "{A} announced plans to cut {N} jobs",
            "{N} jobs were cut by {A}",
        ),
        denies=(
            "{A} did not cut {N} jobs",
            "{A} denied it would cut {N} jobs",
        ),
        opposite=(
            "{A} added {N} jobs",
            "{A} created {N} new jobs",
            "{A} said it would hire {N} new workers",
        ),
    ),
    Frame(
        "appointment",
        {"A": "company", "B": "person", "T": "title"},
        says=(
            "{A} named {B} as its new {T}",
            "{A} appointed {B} {T}",
            "{B} was named {T} of {A}",
            "{B} was appointed {T} of {A}",
            "{A} hired {B} as {T}",
        ),
        denies=(
            "{A} did not name {B} as its new {T}",
            "{B} was not appointed {T} of {A}",
        ),
        opposite=(
            "{A} fired {B} as {T}",
            "{B} was removed as {T} of {A}",
            "{B} resigned as {T} of {A}",
        ),
    ),
    Frame(
        "arrest",
        {"B": "person", "P": "city"},
        says=(
            "police arrested {B} in {P}",
            "{B} was arrested by police in {P}",
            "police in {P} detained {B}",
            "{B} was taken into custody in {P}",
        ),
        denies=(
            "police did not arrest {B} in {P}",
            "{B} was not arrested in {P}",
        ),
        opposite=(
            "police released {B} in {P}",
            "{B} was released by police in {P}",
            "{B} was freed from custody in {P}",
        ),
    ),
    Frame(
        "earnings",
        {"A": "company", "M": "money", "Q": "quarter"},
        says=(
            "{A} reported a profit of {M} in the {Q} quarter",
            "{A} posted {Q}-quarter earnings of {M}",
            "{A} said it earned {M} in the {Q} quarter",
            "{A} made a {Q}-quarter profit of {M}",
        ),
        denies=(),
        opposite=(
            "{A} reported a loss of {M} in the {Q} quarter",
            "{A} posted a {Q}-quarter loss of {M}",
            "{A} said it lost {M} in the {Q} quarter",
        ),
        dated=False,
    ),
    Frame(
        "prices",
        {"A": "company", "R": "percent"},
        says=(
            "{A} raised prices by {R}",
            "{A} increased its prices by {R}",
            "{A} said it would lift prices by {R}",
            "prices at {A} went up by {R}",
        ),
        denies=(
            "{A} did not raise prices by {R}",
            "{A} denied it would increase prices by {R}",
        ),
        opposite=(
            "{A} cut prices by {R}",
            "{A} lowered its prices by {R}",
            "prices at {A} went down by {R}",
        ),
    ),
    Frame(
        "shares",
        {"A": "company", "R": "percent"},
        says=(
            "shares of {A} rose {R}",
            "{A} shares climbed {R}",
            "{A} stock gained {R}",
            "the stock of {A} went up {R}",
        ),
        denies=(),
        opposite=(
            "shares of {A} fell {R}",
            "{A} shares dropped {R}",
            "{A} stock lost {R}",
            "the stock of {A} went down {R}",
        ),
    ),
    Frame(
        "opening",
        {"A": "company", "F": "facility", "P": "city"},
        says=(
            "{A} opened a new {F} in {P}",
            "{A} launched a new {F} in {P}",
            "a new {F} was opened by {A} in {P}",
            "{A} opened its first {F} in {P}",
        ),
        denies=(
            "{A} did not open a new {F} in {P}",
            "no new {F} was opened by {A} in {P}",
        ),
        opposite=(
            "{A} closed its {F} in {P}",
            "{A} shut down its {F} in {P}",
            "the {F} of {A} in {P} was closed",
        ),
    ),
    Frame(
        "visit",
        {"A": "person", "P": "city"},
        says=(
            "{A} visited {P}",
            "{A} travelled to {P}",
            "{A} made a trip to {P}",
            "{A} arrived in {P} for a visit",
        ),
        denies=(
            "{A} did not visit {P}",
            "{A} did not travel to {P}",
        ),
        opposite=(
            "{A} cancelled a trip to {P}",
            "{A} called off a visit to {P}",
        ),
    ),
    Frame(
        "discovery",
        {"U": "university", "X": "finding"},
        says=(
            "researchers at {U} discovered {X}",
            "scientists at {U} found {X}",
            "{X} was discovered by researchers at {U}",
            "a team at {U} identified {X}",
        ),
        denies=(
            "researchers at {U} did not find {X}",
            "scientists at {U} found no sign of {X}",
        ),
        opposite=(
            "researchers at {U} failed to find {X}",
            "scientists at {U} ruled out {X}",
        ),
    ),
]


@dataclass(frozen=True)
class Event:
    """A frame with its slots filled: ``values`` maps slot name to a tuple of spellings."""

    frame: Frame
    values: tuple[tuple[str, tuple[str, ...]], ...]
    date: tuple[str, ...] | None
    polarity: str = "says"

    def value(self, slot: str) -> tuple[str, ...]:
        return dict(self.values)[slot]

    def with_value(self, slot: str, spellings: tuple[str, ...]) -> Event:
        values = tuple((name, spellings if name == slot else old) for name, old in self.values)
        return replace(self, values=values)


def sample_event(rng: random.Random, frame: Frame | None = None) -> Event:
    """Return a random event (polarity "says") of ``frame``, or of a random frame."""
    frame = frame or rng.choice(FRAMES)
    values = []
    for slot, category in frame.slots.items():
        taken = [v for _, v in values]
        # Two slots of one category (buyer and bought company) hold different values.
        choices = [v for v in CATEGORIES[category] if v not in taken]
        values.append((slot, rng.choice(choices)))
    date = rng.choice(DATES) if frame.dated and rng.random() < 0.5 else None
    return Event(frame, tuple(values), date)


def templates_of(event: Event) -> tuple[str, ...]:
    """Return the templates that express ``event``'s polarity."""
    return getattr(event.frame, event.polarity)


def render(event: Event, rng: random.Random, template_index: int | None = None) -> str:
    """Return one sentence expressing ``event``, with random wording.

    ``template_index`` picks the template (modulo their number); None draws one.
    """
    templates = templates_of(event)
    index = rng.randrange(len(templates)) if template_index is None else template_index % len(templates)
    core = templates[index].format(**{slot: rng.choice(spellings) for slot, spellings in event.values})
    if event.date is not None:
        date = event.date[0]
        core = f"{date}, {core}" if rng.random() < 0.4 else f"{core} {date}"
    if rng.random() < 0.15:
        source = rng.choice(ATTRIBUTIONS)
        core = f"{source} that {core}" if rng.random() < 0.3 and "said" in source else f"{core}, {source}"
    # "Summit Steel Inc." already ends the sentence with its full stop.
    return core[0].upper() + core[1:] + ("" if core.endswith(".") else ".")


def _other_value(
    rng: random.Random, category: str, current: tuple[str, ...], avoid: list[tuple[str, ...]] = ()
) -> tuple[str, ...]:
    """Return another value of ``category``, half the time one that shares a word with ``current``."""
    others = [v for v in CATEGORIES[category] if v != current and v not in avoid]
    words = set(current[0].split())
    close = [v for v in others if words & set(v[0].split()) - {"the", "a", "of", "new", "in", "on"}]
    return rng.choice(close if close and rng.random() < 0.5 else others)


# The ways a non-paraphrase is made, and how often each is drawn. A kind that
# does not apply to an event (a frame without negation, an event without a
# number) falls back to changing an entity. The weights are tuned so that the
# tiny course model lands between 0.70 and 0.80 validation accuracy: it learns
# negations and opposite verbs within three epochs, while changed entities,
# numbers, dates and roles (which need the two sentences compared word by word)
# mostly stay beyond it, as paraphrase detection does for small real models.
NEGATIVE_KINDS = {
    "negation": 0.32,
    "opposite": 0.32,
    "unrelated": 0.12,
    "entity": 0.10,
    "number": 0.06,
    "date": 0.04,
    "swap": 0.04,
}


def change_event(event: Event, rng: random.Random, kind: str) -> tuple[Event, str]:
    """Return a copy of ``event`` whose meaning differs, and the kind of change made.

    The change is ``kind`` where it applies to the event; otherwise an entity changes.
    """
    frame = event.frame
    numbers = [s for s, c in frame.slots.items() if c in NUMBER_CATEGORIES]
    entities = [s for s, c in frame.slots.items() if c not in NUMBER_CATEGORIES and c != "quarter"]
    if kind == "negation" and frame.denies:
        return replace(event, polarity="denies"), kind
    if kind == "opposite":
        return replace(event, polarity="opposite"), kind
    if kind == "swap" and frame.swappable:
        a, b = frame.swappable
        return event.with_value(a, event.value(b)).with_value(b, event.value(a)), kind
    if kind == "number" and numbers:
        slot = rng.choice(numbers)
        return event.with_value(slot, _other_value(rng, frame.slots[slot], event.value(slot))), kind
    if kind == "date" and event.date is not None:
        return replace(event, date=rng.choice([d for d in DATES if d != event.date])), kind
    if kind == "date" and "Q" in frame.slots:
        return event.with_value("Q", _other_value(rng, "quarter", event.value("Q"))), kind
    if kind == "unrelated":
        # Half the time another kind of event, half the time the same kind with other participants.
        other = sample_event(rng, None if rng.random() < 0.5 else frame)
        return replace(other, date=event.date if rng.random() < 0.5 else other.date), kind
    slot = rng.choice(entities)
    taken = [v for s, v in event.values if s != slot]
    return event.with_value(slot, _other_value(rng, frame.slots[slot], event.value(slot), avoid=taken)), "entity"


def make_pair(rng: random.Random, positive_rate: float, noise_rate: float) -> tuple[str, str, int, str]:
    """Return ``(sentence1, sentence2, label, kind)``; label 1 means paraphrase.

    ``positive_rate`` is the share of pairs generated as paraphrases and
    ``noise_rate`` the share of labels then flipped. ``kind`` says how the pair
    was made, "paraphrase" or a key of NEGATIVE_KINDS, whatever its final label.
    """
    event = sample_event(rng)
    if rng.random() < positive_rate:
        label, other, kind = 1, event, "paraphrase"
    else:
        kind = rng.choices(list(NEGATIVE_KINDS), weights=list(NEGATIVE_KINDS.values()))[0]
        other, kind = change_event(event, rng, kind)
        label = 0
    # Both kinds of pair mostly use two different templates, so the wording alone
    # does not give the label away; sometimes one template for a minimal pair.
    first = rng.randrange(len(templates_of(event)))
    second = first if rng.random() < 0.25 else first + 1 + rng.randrange(max(len(templates_of(other)) - 1, 1))
    sentence1 = render(event, rng, first)
    sentence2 = render(other, rng, second)
    for _ in range(10):  # a paraphrase worded identically teaches nothing: reword it
        if sentence1 != sentence2:
            break
        sentence2 = render(other, rng)
    if rng.random() < 0.5:
        sentence1, sentence2 = sentence2, sentence1
    if rng.random() < noise_rate:
        label = 1 - label
    return sentence1, sentence2, label, kind


def generate_pairs(
    rng: random.Random, count: int, positive_rate: float, noise_rate: float
) -> list[tuple[str, str, int, str]]:
    """Return ``count`` distinct pairs ``(sentence1, sentence2, label, kind)``, none repeated in either order."""
    pairs, seen = [], set()
    while len(pairs) < count:
        sentence1, sentence2, label, kind = make_pair(rng, positive_rate, noise_rate)
        key = frozenset((sentence1, sentence2))
        if sentence1 == sentence2 or key in seen:
            continue
        seen.add(key)
        pairs.append((sentence1, sentence2, label, kind))
    return pairs


def generate_sentences(rng: random.Random, count: int, exclude: set[str]) -> list[str]:
    """Return ``count`` distinct sentences of random events, none of them in ``exclude``."""
    sentences, seen = [], set(exclude)
    polarities = ["says", "says", "denies", "opposite"]
    while len(sentences) < count:
        event = sample_event(rng)
        polarity = rng.choice(polarities)
        if polarity == "denies" and not event.frame.denies:
            polarity = "says"
        sentence = render(replace(event, polarity=polarity), rng)
        if sentence not in seen:
            seen.add(sentence)
            sentences.append(sentence)
    return sentences
