"""MkDocs hook of the documentation site (``mkdocs.yml``: ``hooks: [tools/docs_site.py]``).

Everything on the site that is derived from the repository is generated here at build time, so
nothing is copied into ``docs/`` and nothing can drift:

- the API reference: one page per public name of ``rlloss.__all__`` and ``rlloss.data.__all__``,
  one page per group of ``rlloss.functional.__all__`` (grouped by the module that defines each
  function), each entry written by its public path (``::: rlloss.ClipPPOLoss``), never by the
  module that defines it; the pages and their navigation come from ``__all__`` itself, so a new
  public name gets its page without an edit here (``tests/test_docs_site.py`` checks it);
- the tutorials gallery: one entry per ``tutorials/*.py`` (its docstring's summary and its
  learning curves, ``benchmarks/results/learning_<tutorial>*.png``, served from where they are);
- the benchmark headline: ``BENCHMARKS.md``'s tables;
- after each API entry: its keys table (from ``_AcceptedKeys``), its tutorials, its section of
  ``docs/results.md`` (the MuJoCo losses) and its source: one page per module of ``rlloss``
  (the project has no public repository URL to link to);
- the equations: the docstrings' ``$...$`` / ``$$...$$`` (``pymdownx.arithmatex``) typeset as
  MathML at build time (``latex2mathml``), so the site loads no math script.

``api_pages()``, ``tutorial_entries()`` and ``benchmarks_markdown()`` need no MkDocs; the hooks
(``on_config``, ``on_files``, ``on_page_markdown``, ``on_page_content``) are the MkDocs side.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import importlib
import inspect
import io
import re
import sys
import textwrap
import tokenize
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # document the checkout's rlloss, as mkdocstrings reads it
    sys.path.insert(0, str(ROOT))

API_NAV_TITLE = "API reference"
TUTORIALS_MARKER = "<!-- tutorials-gallery -->"
BENCHMARKS_MARKER = "<!-- benchmarks-headline -->"

# Reading order of the API reference's sections: a public name not listed here still gets its
# page, under "Other" (the pages follow ``__all__``, the grouping is only for the reader).
CATEGORIES: dict[str, tuple[str, ...]] = {
    "On-policy losses": (
        "PPOLoss",
        "ClipPPOLoss",
        "KLPENPPOLoss",
        "RPOLoss",
        "A2CLoss",
        "ReinforceLoss",
    ),
    "Off-policy losses": (
        "DQNLoss",
        "DDQNLoss",
        "DistributionalDQNLoss",
        "DDPGLoss",
        "TD3Loss",
        "SACLoss",
        "DiscreteSACLoss",
        "REDQLoss",
        "CrossQLoss",
        "TQCLoss",
        "MPOLoss",
        "DiscreteMPOLoss",
    ),
    "Offline losses": ("IQLLoss", "DiscreteIQLLoss", "CQLLoss", "DiscreteCQLLoss", "TD3BCLoss"),
    "Multi-agent losses": ("MAPPOLoss", "IPPOLoss", "QMixerLoss"),
    "Imitation and exploration losses": (
        "BCLoss",
        "DiffusionBCLoss",
        "ACTLoss",
        "GAILLoss",
        "DTLoss",
        "OnlineDTLoss",
        "RNDLoss",
    ),
    "World-model losses": (
        "DreamerModelLoss",
        "DreamerActorLoss",
        "DreamerValueLoss",
        "DreamerV3ActorLoss",
        "DreamerV3Loss",
        "DreamerV3ModelLoss",
        "DreamerV3ValueLoss",
        "WorldModelLoss",
        "ExponentialQuadraticCost",
    ),
    "LLM post-training losses": (
        "GRPOLoss",
        "DAPO",
        "CISPOLoss",
        "DrGRPOLoss",
        "GSPOLoss",
        "SFTLoss",
        "DistillationLoss",
        "DPOLoss",
        "SimPOLoss",
        "KTOLoss",
        "MCAdvantage",
        "MCAdvantageSelector",
    ),
    "Base class": ("LossModule",),
    "Value estimators": (
        "GAE",
        "TD0Estimator",
        "TD1Estimator",
        "TDLambdaEstimator",
        "VTrace",
        "MultiAgentGAE",
        "ValueEstimator",
    ),
    "Policy-loss add-ons": ("PolicyLossAddon", "BehaviorCloning", "AttractionKL", "ActorOutput"),
    "Training helpers": (
        "KLAdaptiveLR",
        "PiecewiseSchedule",
        "KLEarlyStopping",
        "kl_exceeds",
        "RewardNormalizer",
        "ValueNormalizer",
        "chunk_sequences",
        "recurrent_state_keys",
    ),
    "Target networks and the compiled update": (
        "SoftUpdate",
        "HardUpdate",
        "compile_update",
        "Update",
    ),
    "Errors and checks": ("MissingKeyError", "set_checks"),
}
OTHER = "Other"

# Titles of the groups of rlloss.functional (the defining module's last name); a new module's
# group is titled by its name.
FUNCTIONAL_TITLES = {
    "returns": "Returns and advantages",
    "policy": "Policy objectives",
    "critic": "Critic losses",
    "q": "Q-learning targets",
    "quantile": "Quantile critics",
    "distributions": "Distributions",
    "mpo": "MPO",
    "reduce": "Reductions",
    "world_models": "World models",
    "preference": "Preference optimisation",
}

# The sections of docs/results.md (heading anchors ``{ #ppo }``...) and the losses whose API page
# links to them: the MuJoCo tutorials' losses.
RESULTS_SECTIONS: dict[str, tuple[str, ...]] = {
    "ppo": ("PPOLoss", "ClipPPOLoss"),
    "sac": ("SACLoss",),
    "td3": ("TD3Loss",),
}
RESULTS_TITLES = {"ppo": "PPO", "sac": "SAC", "td3": "TD3"}

# The source pages' heading id of a top-level class or function, its name after it.
SOURCE_ANCHOR_PREFIX = "def-"

# Learning curves written under another name than their tutorial's (td3_pendulum.py --ddpg).
FIGURE_OWNERS = {"ddpg_pendulum": "td3_pendulum"}


@dataclass(frozen=True)
class ApiPage:
    """One generated page of the API reference."""

    path: str  # relative to docs/, e.g. "api/ClipPPOLoss.md"
    title: str
    section: tuple[str, ...]  # where it sits in the navigation under API_NAV_TITLE
    names: tuple[str, ...]  # the public paths it documents, e.g. ("rlloss.ClipPPOLoss",)

    def markdown(self) -> str:
        up = "../" * self.path.count("/")  # from this page to docs/
        if len(self.names) == 1:  # the object's own heading is the page's title
            extras = class_extras_markdown(self.names[0], up)
            return f"::: {self.names[0]}\n{extras}\n{source_markdown(self.names, up)}"
        sections = "\n\n".join(
            f"::: {name}\n    options:\n      heading_level: 2" for name in self.names
        )
        return f"# {self.title}\n\n{sections}\n\n{source_markdown(self.names, up)}"


def _public(module_name: str) -> list[str]:
    module = importlib.import_module(module_name)
    names = getattr(module, "__all__", None)
    if names is None:
        names = [n for n in vars(module) if not n.startswith("_")]
    return list(names)


def _is_module(module_name: str, name: str) -> bool:
    return type(getattr(importlib.import_module(module_name), name)).__name__ == "module"


def api_pages() -> list[ApiPage]:
    """Every API page, from ``rlloss.__all__``, ``rlloss.functional.__all__``, ``rlloss.data``."""
    top = [n for n in _public("rlloss") if not _is_module("rlloss", n)]
    category_of = {name: cat for cat, names in CATEGORIES.items() for name in names}
    pages = []
    order = list(CATEGORIES) + [OTHER]
    for name in sorted(
        top,
        key=lambda n: (order.index(category_of.get(n, OTHER)), _order_in_category(n, category_of)),
    ):
        pages.append(
            ApiPage(
                f"api/{name}.md",
                name,
                ("rlloss", category_of.get(name, OTHER)),
                (f"rlloss.{name}",),
            )
        )
    functional = importlib.import_module("rlloss.functional")
    groups: dict[str, list[str]] = {}
    for name in _public("rlloss.functional"):
        module = getattr(getattr(functional, name), "__module__", "") or ""
        groups.setdefault(module.rsplit(".", 1)[-1], []).append(name)
    for group in sorted(
        groups,
        key=lambda g: (
            g not in FUNCTIONAL_TITLES,
            list(FUNCTIONAL_TITLES).index(g) if g in FUNCTIONAL_TITLES else 0,
            g,
        ),
    ):
        title = FUNCTIONAL_TITLES.get(group, group)
        pages.append(
            ApiPage(
                f"api/functional/{group}.md",
                title,
                ("rlloss.functional",),
                tuple(f"rlloss.functional.{n}" for n in groups[group]),
            )
        )
    for name in _public("rlloss.data"):
        pages.append(
            ApiPage(f"api/data/{name}.md", name, ("rlloss.data",), (f"rlloss.data.{name}",))
        )
    return pages


def _order_in_category(name: str, category_of: dict[str, str]) -> tuple[int, str]:
    names = CATEGORIES.get(category_of.get(name, OTHER), ())
    return (names.index(name) if name in names else len(names), name)


# ---- what the docstrings do not hold: the keys table, the tutorials -----------------------------


@dataclass(frozen=True)
class KeyRow:
    """One key of a loss or an estimator, as ``set_keys`` names it."""

    name: str
    default: object
    role: str  # "read", "written", "read or written", UNUSED
    shape: str  # "[*B, 1]", "[*B] or [*B, A]", UNUSED for a key never touched, "" when undeclared
    meaning: str


def _field_comments(cls: type) -> dict[str, str]:
    """The comment after each field of a dataclass body (``name: T = default  # doc``), read from
    its source: the one place a key is declared and documented."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    comments = {}
    lines = source.splitlines()
    for node in ast.parse(source).body[0].body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            line = lines[node.end_lineno - 1]
            tokens = tokenize.generate_tokens(io.StringIO(line).readline)
            text = next((t.string for t in tokens if t.type == tokenize.COMMENT), "")
            comments[node.target.id] = text.lstrip("#").strip()
    return comments


_SHAPE = re.compile(r"`{0,2}(\[[^\]]*(?:\*B|B\b|T\b|N\b|\d)[^\]]*\])`{0,2}")
# A key kept only so that TorchRL's ``set_keys`` names work, which the class never touches: its
# shape column says so instead of a shape.
_UNUSED = re.compile(r"\(not (?:read|written)\)")
UNUSED = "not used"


def key_rows(cls: type) -> list[KeyRow]:
    """The keys of ``cls._AcceptedKeys`` (a dataclass, one field per key, each documented by the
    comment after it: ``written: ...`` for a key the class writes, a shape in brackets)."""
    keys = getattr(cls, "_AcceptedKeys", None)
    if keys is None or not dataclasses.is_dataclass(keys):
        return []
    comments: dict[str, str] = {}
    for base in reversed(keys.__mro__):
        if dataclasses.is_dataclass(base):
            comments.update(_field_comments(base))
    rows = []
    for field in dataclasses.fields(keys):
        doc = comments.get(field.name, "")
        low = doc.lower()
        # "written: ..." (or "written into / for ..."): the class writes it; "written by the
        # critic" is an entry its network writes and it reads
        role = (
            UNUSED
            if _UNUSED.search(low)
            else "written"
            if re.match(r"written(:| into| for)", low)
            else "read or written"
            if low.startswith("read (or written")
            else "read"
        )
        shapes = _SHAPE.findall(doc)  # "index [*B] or one-hot [*B, A]": both
        shape = " or ".join(shapes) if shapes else UNUSED if role == UNUSED else ""
        rows.append(KeyRow(field.name, field.default, role, shape, doc))
    return rows


def _code(value: object) -> str:
    if value is None:
        return "`None`"
    text = repr(value) if isinstance(value, tuple) else f'"{value}"'
    return f"`{text}`"


def keys_markdown(cls: type) -> str:
    rows = key_rows(cls)
    if not rows:
        return ""
    name = cls.__name__
    out = [
        f"## Keys of `{name}`",
        "",
        f"The entries `{name}` reads and writes, each remapped with "
        f"`.set_keys(<name>=<your key>)` (a nested key is a tuple).",
        "",
        "| name | default key | read / written | shape | meaning |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        meaning = row.meaning.replace("|", "\\|") or "&nbsp;"
        shape = (
            f"*{row.shape}*"
            if row.shape == UNUSED
            else " or ".join(f"`{part}`" for part in row.shape.split(" or "))
            if row.shape
            else "&nbsp;"
        )
        out.append(f"| `{row.name}` | {_code(row.default)} | {row.role} | {shape} | {meaning} |")
    return "\n".join(out) + "\n"


def tutorials_using(name: str) -> list[Tutorial]:
    """The tutorials whose source names ``name`` (as a word)."""
    word = re.compile(rf"\b{re.escape(name)}\b")
    return [entry for entry in tutorial_entries() if word.search(_tutorial_source(entry.name))]


@functools.cache
def _tutorial_source(name: str) -> str:
    return (ROOT / "tutorials" / f"{name}.py").read_text(encoding="utf-8")


def tutorials_markdown_for(name: str, up: str = "../") -> str:
    entries = tutorials_using(name)
    if not entries:
        return ""
    out = [f"## Tutorials using `{name}`", ""]
    for entry in entries:
        curves = " (with its learning curves)" if entry.figures else ""
        out.append(
            f"- [`tutorials/{entry.name}.py`]({up}tutorials.md#{_anchor(entry.name)}){curves}: "
            f"{_code_spans(entry.summary)}"
        )
    return "\n".join(out) + "\n"


def _anchor(tutorial: str) -> str:
    """The tutorials page's heading id of ``tutorial`` (MkDocs' toc slug of "`name.py`")."""
    return re.sub(r"[^\w-]", "", f"{tutorial}.py".lower())


def class_extras_markdown(full: str, up: str = "../") -> str:
    """What follows a class's docstring on its page: its keys table and its tutorials (linked
    through ``up``, the path from the page to ``docs/``)."""
    module_name, name = full.rsplit(".", 1)
    obj = getattr(importlib.import_module(module_name), name)
    if not inspect.isclass(obj):
        return ""
    parts = [keys_markdown(obj), tutorials_markdown_for(name, up), results_markdown_for(name, up)]
    return "".join(f"\n{part}" for part in parts if part)


def results_markdown_for(name: str, up: str = "../") -> str:
    """The link from a loss's page to its rows on ``docs/results.md`` (its algorithm's section,
    whose heading carries the anchor ``{ #<algorithm> }``)."""
    algorithm = next((a for a, names in RESULTS_SECTIONS.items() if name in names), None)
    if algorithm is None:
        return ""
    return (
        f"## Results of `{name}` on MuJoCo\n\n"
        f"[{RESULTS_TITLES[algorithm]} on MuJoCo]({up}results.md#{algorithm}): the learning "
        "curves, final and best evaluation returns per seed beside TorchRL's class in the same "
        "loop, and the commands that reproduce each row.\n"
    )


def _source_path(full: str) -> tuple[str, int] | None:
    """The repository path of the module that defines ``full`` and the line it starts at."""
    module_name, name = full.rsplit(".", 1)
    obj = inspect.unwrap(getattr(importlib.import_module(module_name), name))
    try:
        path = Path(inspect.getsourcefile(obj)).resolve()
        line = inspect.getsourcelines(obj)[1]
    except (OSError, TypeError):
        return None
    if not path.is_relative_to(ROOT):
        return None
    return path.relative_to(ROOT).as_posix(), line


def source_markdown(names: tuple[str, ...], up: str = "../") -> str:
    """Where ``names`` are defined: a link each to the site's page of the module's source
    (:func:`source_page`), at the definition's section."""
    found = [(name, _source_path(name)) for name in names]
    found = [(name, where) for name, where in found if where is not None]
    if not found:
        return ""
    out = ["## Source", ""]
    for name, (path, line) in found:
        short = name.rsplit(".", 1)[1]
        target = f"{up}{source_page_path(path)}#{SOURCE_ANCHOR_PREFIX}{short}"
        out.append(f"- `{name}`: [`{path}`, line {line}]({target})")
    return "\n".join(out) + "\n"


def source_page_path(path: str) -> str:
    """The site's page (relative to docs/) showing the repository file ``path``."""
    return f"source/{path}.md"


def source_page(path: str) -> str:
    """The Markdown of the page showing the repository file ``path``: its source highlighted with
    the file's line numbers, cut before each top-level class and function under a heading
    ``#def-<name>`` (the API pages link there; the build checks the anchors); left out of the
    search index (and, by ``mkdocs.yml``'s ``not_in_nav``, of the navigation)."""
    code = (ROOT / path).read_text(encoding="utf-8")
    lines = code.splitlines()
    fence = "`" * max(3, 1 + max((len(m) for m in re.findall(r"`+", code)), default=0))
    starts = [
        (min([node.lineno, *(d.lineno for d in node.decorator_list)]), node)
        for node in ast.parse(code).body
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
    ]
    out = ["---", "search:", "  exclude: true", "---", "", f"# `{path}`", ""]
    out += [f"The source of `{path}` in the repository, as this site was built from it.", ""]
    bounds = [(1, None)] + starts
    for i, (first, node) in enumerate(bounds):
        last = bounds[i + 1][0] - 1 if i + 1 < len(bounds) else len(lines)
        if node is not None:
            kind = "class" if isinstance(node, ast.ClassDef) else "def"
            out += [f"## {kind} `{node.name}` {{ #{SOURCE_ANCHOR_PREFIX}{node.name} }}", ""]
        if last >= first:
            out += [f'{fence}python linenums="{first}"', *lines[first - 1 : last], fence, ""]
    return "\n".join(out)


def source_pages(pages: list[ApiPage]) -> dict[str, str]:
    """One page per module that defines a documented name (:func:`source_page`)."""
    paths = {where[0] for page in pages for name in page.names if (where := _source_path(name))}
    return {source_page_path(path): source_page(path) for path in sorted(paths)}


def _summary(obj: object) -> str:
    doc = (getattr(obj, "__doc__", None) or "").strip()
    return doc.split("\n\n", 1)[0].replace("\n", " ") if doc else ""


def api_index_markdown(pages: list[ApiPage]) -> str:
    """The API reference's front page: every public name, its one-line summary, its page."""
    out = [
        "# API reference",
        "",
        "Generated from the docstrings: every public name of `rlloss`, `rlloss.functional` and "
        "`rlloss.data`, by the path you import it from. Where rlloss deliberately differs from "
        "TorchRL, see [Differences from TorchRL](../differences.md).",
    ]
    section = None
    for page in pages:
        if page.section != section:
            section = page.section
            out += ["", f"## {' / '.join(section)}", ""]
        for full in page.names:
            module_name, name = full.rsplit(".", 1)
            obj = getattr(importlib.import_module(module_name), name)
            out.append(f"- [`{full}`][{full}]: {_summary(obj)}")
    return "\n".join(out) + "\n"


def api_nav(pages: list[ApiPage]) -> list:
    """The navigation entries of the API reference (MkDocs ``nav`` syntax)."""
    nav: list = [{"Overview": "api/index.md"}]
    for page in pages:
        level = nav
        for title in page.section:
            for entry in level:
                if isinstance(entry, dict) and title in entry:
                    level = entry[title]
                    break
            else:
                new: list = []
                level.append({title: new})
                level = new
        level.append({page.title: page.path})
    return nav


@dataclass(frozen=True)
class Tutorial:
    name: str
    summary: str
    figures: tuple[str, ...]  # repository paths of the learning curves


@functools.cache
def tutorial_entries() -> tuple[Tutorial, ...]:
    """One entry per ``tutorials/*.py`` (the ``_`` helpers left out), with its curves (read once
    a build: ``on_config`` clears the cache)."""
    figures = sorted((ROOT / "benchmarks" / "results").glob("learning_*.png"))
    entries = []
    for path in sorted((ROOT / "tutorials").glob("[!_]*.py")):
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
        mine = tuple(
            f.relative_to(ROOT).as_posix()
            for f in figures
            if _figure_owner(f.stem.removeprefix("learning_"), path.stem) == path.stem
        )
        entries.append(Tutorial(path.stem, doc.split("\n\n", 1)[0].replace("\n", " "), mine))
    return tuple(entries)


def _figure_owner(run: str, tutorial: str) -> str | None:
    if run in FIGURE_OWNERS:
        return FIGURE_OWNERS[run]
    return tutorial if run == tutorial or run.startswith(tutorial + "_") else None


def tutorials_markdown() -> str:
    out = []
    for entry in tutorial_entries():
        out += [f"### `{entry.name}.py`", "", _code_spans(entry.summary), ""]
        for figure in entry.figures:
            run = Path(figure).stem.removeprefix("learning_")
            out += [f"![{run}: learning curves]({figure}){{ loading=lazy }}", ""]
        if not entry.figures:
            out += ["*(no learning curve recorded by the benchmark for this one)*", ""]
        out += [f"Source: `tutorials/{entry.name}.py`", ""]
    return "\n".join(out)


def _code_spans(text: str) -> str:
    return text.replace("``", "`")  # the tutorials' docstrings are reST-flavoured


def benchmarks_markdown() -> str:
    """``BENCHMARKS.md`` without its title; links into the repository become file names (links
    to its own sections stay links)."""
    text = (ROOT / "BENCHMARKS.md").read_text(encoding="utf-8")
    text = re.sub(r"\A# [^\n]*\n+", "", text)
    return re.sub(r"\[([^\]]+)\]\(((?!https?://|#)[^)]+)\)", r"\1 (`\2`)", text)


# ---- the MkDocs side ------------------------------------------------------------------------

_pages: list[ApiPage] = []


def on_config(config, **kwargs):
    tutorial_entries.cache_clear()
    _tutorial_source.cache_clear()
    _pages[:] = api_pages()
    nav = config.get("nav") or []
    for i, entry in enumerate(nav):
        if isinstance(entry, dict) and API_NAV_TITLE in entry:
            nav[i] = {API_NAV_TITLE: api_nav(_pages)}
            break
    else:
        nav.append({API_NAV_TITLE: api_nav(_pages)})
    config["nav"] = nav
    return config


def on_files(files, config, **kwargs):
    from mkdocs.structure.files import File

    files.append(File.generated(config, "api/index.md", content=api_index_markdown(_pages)))
    for page in _pages:
        files.append(File.generated(config, page.path, content=page.markdown()))
    for path, content in source_pages(_pages).items():
        files.append(File.generated(config, path, content=content))
    for entry in tutorial_entries():  # the curves, served from where the benchmark wrote them
        for figure in entry.figures:
            files.append(File(figure, str(ROOT), config["site_dir"], config["use_directory_urls"]))
    return files


# Sphinx roles in the docstrings (":class:`PPOLoss`"), as rendered: the code span after the role.
_ROLE = re.compile(r":(?:class|func|meth|mod|attr|data|exc|obj):<code>~?([\w.]+?)(?:\(\))?</code>")


def sphinx_roles_to_links(html: str, public: set[str]) -> str:
    """A role naming a public name becomes a link to its entry, any other one a code span."""

    def link(match: re.Match) -> str:
        target = match.group(1)
        for full in (
            target,
            f"rlloss.{target}",
            f"rlloss.functional.{target}",
            f"rlloss.data.{target}",
        ):
            if full in public:
                return f'<autoref identifier="{full}" optional><code>{target}</code></autoref>'
        return f"<code>{target}</code>"

    return _ROLE.sub(link, html)


# Equations, as pymdownx.arithmatex (generic mode) leaves them: ``$...$`` as an inline span,
# ``$$...$$`` as a block, the LaTeX between ``\(`` ``\)`` or ``\[`` ``\]``, HTML-escaped.
_MATH = re.compile(
    r'<(?P<tag>span|div) class="arithmatex">\s*'
    r"\\(?P<open>[(\[])(?P<latex>.*?)\\[)\]]\s*</(?P=tag)>",
    re.S,
)


def latex_to_mathml(html_text: str, where: str = "") -> str:
    """Each equation typeset as MathML (Chromium, Firefox and Safari render MathML Core), at build
    time: the site loads no math script and needs no network. An equation latex2mathml cannot
    read fails the build, naming the page and the LaTeX."""
    from html import unescape

    from latex2mathml.converter import convert

    def typeset(match: re.Match) -> str:
        latex = unescape(match.group("latex")).strip()
        display = "block" if match.group("open") == "[" else "inline"
        # a block's equations, side by side after ``\qquad`` in the source, one a line here:
        # the text column is narrower than a plain-text line
        parts = split_equations(latex) if display == "block" else [latex]
        try:
            mathml = "".join(convert(part, display=display) for part in parts)
        except Exception as error:  # latex2mathml raises its own exception classes
            raise ValueError(
                f"{where}: the equation {latex!r} is not LaTeX that latex2mathml reads ({error}); "
                "rewrite it with the commands it supports (\\frac, \\sum, \\operatorname, ...)"
            ) from error
        return f'<{match.group("tag")} class="arithmatex">{mathml}</{match.group("tag")}>'

    return _MATH.sub(typeset, html_text)


def split_equations(latex: str) -> list[str]:
    """``latex`` cut at each ``\\qquad`` outside braces and environments (``\\begin{cases}``):
    the separate equations of a display block."""
    parts, depth, start = [], 0, 0
    for token in re.finditer(r"\\begin\b|\\end\b|\\qquad\b|(?<!\\)[{}]", latex):
        text = token.group()
        if text in ("{", "\\begin"):
            depth += 1
        elif text in ("}", "\\end"):
            depth -= 1
        elif depth == 0:
            parts.append(latex[start : token.start()])
            start = token.end()
    parts.append(latex[start:])
    return [part.strip() for part in parts if part.strip()]


def on_page_content(html, page, config, files, **kwargs):
    html = latex_to_mathml(html, page.file.src_uri)
    return sphinx_roles_to_links(html, {n for p in _pages for n in p.names})


def on_page_markdown(markdown, page, config, files, **kwargs):
    if TUTORIALS_MARKER in markdown:
        markdown = markdown.replace(TUTORIALS_MARKER, tutorials_markdown())
    if BENCHMARKS_MARKER in markdown:
        markdown = markdown.replace(BENCHMARKS_MARKER, benchmarks_markdown())
    return markdown
