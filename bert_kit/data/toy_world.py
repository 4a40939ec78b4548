"""A small made-up world written as plain English: the corpus of `bert-kit demo`.

Pretraining a BERT on real text needs hours before its [MASK] answers make sense; on two CPU
cores a demo has minutes. So the demo's corpus is generated: short biographies of people who
live in cities of real countries, speak a language, work somewhere and keep a pet, e.g.

    anna lives in lyon. lyon is a city in france. people in france speak french.
    she works as a baker. every morning she goes to the bakery. ...

Everything a model can learn from it is in the text: facts that recur across documents (lyon is
in france, a baker works at a bakery), grammar (she after anna), and which sentences belong
together (the next-sentence task). The held-out documents are biographies of people whose names never
occur in training, so fill-mask on them answers from what the model learnt, not from memory.
The fine-tuning task asks what a sentence is about (home, work, pet or free time), scored on
sentences about held-out people.
"""

from __future__ import annotations

import random
from pathlib import Path

# country -> (language, cities)
COUNTRIES = {
    "france": ("french", ["paris", "lyon"]),
    "germany": ("german", ["berlin", "munich"]),
    "italy": ("italian", ["rome", "milan"]),
    "spain": ("spanish", ["madrid", "seville"]),
    "japan": ("japanese", ["tokyo", "kyoto"]),
    "greece": ("greek", ["athens", "patras"]),
    "poland": ("polish", ["warsaw", "krakow"]),
}
# job -> (workplace, what the job does)
JOBS = {
    "doctor": ("hospital", "treats sick patients"),
    "teacher": ("school", "teaches the children"),
    "baker": ("bakery", "bakes fresh bread"),
    "chef": ("restaurant", "cooks dinner for the guests"),
    "pilot": ("airport", "flies big planes"),
    "farmer": ("farm", "grows vegetables"),
    "mechanic": ("garage", "repairs broken cars"),
}
# pet -> (food, what it does)
ANIMALS = {
    "dog": ("meat", "barks at the postman"),
    "cat": ("fish", "sleeps on the sofa"),
    "horse": ("hay", "runs in the field"),
    "parrot": ("seeds", "sings in the morning"),
    "rabbit": ("carrots", "hops in the garden"),
}
HOBBIES = ["playing chess", "reading novels", "painting pictures", "swimming in the lake", "playing the piano",
           "hiking in the mountains", "dancing", "playing football", "cooking soup", "watching films"]
NAMES = {"she": ["anna", "maria", "sofia", "emma", "laura", "julia", "clara", "elena", "nina", "sara",
                 "olga", "lucia", "ines", "eva", "alice", "rosa"],
         "he": ["tom", "paul", "peter", "john", "mark", "david", "leo", "max", "luca", "hugo",
                "ivan", "omar", "karl", "felix", "oscar", "hans"]}
HELD_OUT_NAMES = {"she": ["mia", "lena", "hanna", "vera"], "he": ["adam", "boris", "ali", "otto"]}


def city_country() -> dict[str, str]:
    return {city: country for country, (_, cities) in COUNTRIES.items() for city in cities}


def biography(rng: random.Random, names: dict[str, list[str]]) -> list[tuple[str, str]]:
    """One document: (topic, sentence) for a person's home and language, work, pet and hobby."""
    pron = rng.choice(["she", "he"])
    name = rng.choice(names[pron])
    country = rng.choice(sorted(COUNTRIES))
    language, cities = COUNTRIES[country]
    city = rng.choice(cities)
    job = rng.choice(sorted(JOBS))
    place, duty = JOBS[job]
    pet = rng.choice(sorted(ANIMALS))
    food, habit = ANIMALS[pet]
    hobby = rng.choice(HOBBIES)
    pick = rng.choice
    home = [pick([f"{name} lives in {city}.", f"{name} was born in {city}.", f"{name} comes from {city}."]),
            pick([f"{city} is a city in {country}.", f"{city} is in {country}.",
                  f"{city} is one of the cities of {country}."]),
            pick([f"people in {country} speak {language}.", f"{pron} speaks {language} at home.",
                  f"in {country} most people speak {language}."])]
    work = [pick([f"{pron} works as a {job}.", f"{name} is a {job}.", f"{name} has been a {job} for years."]),
            pick([f"every morning {pron} goes to the {place}.", f"{pron} works at the {place}.",
                  f"the {place} is where {name} works."]),
            pick([f"at work {pron} {duty}.", f"a {job} {duty}."])]
    animal = [pick([f"{name} has a {pet}.", f"{pron} keeps a {pet} as a pet.", f"{name} lives with a {pet}."]),
              pick([f"the {pet} eats {food}.", f"every day the {pet} eats {food}.", f"a {pet} likes {food}."]),
              pick([f"the {pet} {habit}.", f"all day the {pet} {habit}."])]
    free = [pick([f"in the evening {pron} likes {hobby}.", f"{name} enjoys {hobby}.",
                  f"on sundays {name} goes {hobby}." if hobby.startswith(("swimming", "hiking", "dancing"))
                  else f"on sundays {name} likes {hobby}."])]
    blocks = [("work", work), ("pet", animal), ("free time", free)]
    rng.shuffle(blocks)  # the order of topics varies; within a topic the sentences follow each other
    return [("home", s) for s in home] + [(topic, s) for topic, block in blocks for s in block]


def write_corpus(folder: str | Path, n_train: int = 4000, n_test: int = 400, seed: int = 0) -> tuple[Path, Path]:
    """train.txt and test.txt: one biography per blank-line-separated block, a sentence a line.
    The test biographies use names no training biography uses."""
    rng = random.Random(seed)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, n, names in (("train.txt", n_train, NAMES), ("test.txt", n_test, HELD_OUT_NAMES)):
        path = folder / name
        path.write_text("\n\n".join("\n".join(s for _, s in biography(rng, names)) for _ in range(n)) + "\n")
        paths.append(path)
    return paths[0], paths[1]


TOPICS = ["home", "work", "pet", "free time"]


def write_topic_task(folder: str | Path, n_train: int = 400, n_dev: int = 400, seed: int = 1) -> tuple[Path, Path, float]:
    """train.tsv / dev.tsv (sentence, label): what a sentence of a biography is about (home, work,
    pet or free time). The dev sentences come from biographies of held-out people. Returns the
    two paths and the dev set's majority-class rate (the accuracy of always guessing that class)."""
    rng = random.Random(seed)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths, majority = [], 0.0
    for name, n, names in (("train.tsv", n_train, NAMES), ("dev.tsv", n_dev, HELD_OUT_NAMES)):
        rows = []
        while len(rows) < n:
            rows.append(rng.choice(biography(rng, names)))
        path = folder / name
        path.write_text("sentence\tlabel\n" + "".join(f"{s}\t{t}\n" for t, s in rows))
        paths.append(path)
        counts = [sum(t == topic for t, _ in rows) for topic in TOPICS]
        majority = max(counts) / len(rows)
    return paths[0], paths[1], majority


# the kinds of word a fill-mask probe asks for, and the words of each kind
def answer_kinds() -> dict[str, set[str]]:
    return {"country": set(COUNTRIES), "language": {language for language, _ in COUNTRIES.values()},
            "workplace": {place for place, _ in JOBS.values()}, "food": {food for food, _ in ANIMALS.values()}}


def fill_mask_probes(path: str | Path, limit: int = 200, context: int = 2) -> list[tuple[str, str, str]]:
    """(text with one [MASK], the masked word, its kind) from the biographies in `path`.

    The masked word is a country, language, workplace or food that the text determines: the
    sentence itself names the city, country, pet, or the sentence before names the job (a
    workplace sentence always follows the job sentence). `context` previous sentences of the
    same biography come first."""
    kinds = answer_kinds()
    probes = []
    for document in Path(path).read_text(encoding="utf-8").split("\n\n"):
        sentences = document.strip().splitlines()
        for i, sentence in enumerate(sentences):
            words = sentence.rstrip(".").split()
            found = [(j, k) for j, w in enumerate(words) for k, v in kinds.items() if w in v]
            if not found or (found[-1][1] == "language" and i == 0):
                continue
            j, kind = found[-1]  # the last one: "people in france speak [french]"
            masked = " ".join(words[:j] + ["[MASK]"] + words[j + 1:]) + "."
            probes.append((" ".join(sentences[max(0, i - context): i] + [masked]), words[j], kind))
            if len(probes) == limit:
                return probes
    return probes
