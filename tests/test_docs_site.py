"""The documentation site: every public name has an API entry, and the built site reads right.

The fast tests check the API pages that ``tools/docs_site.py`` (the site's MkDocs hook) generates
against ``rlloss.__all__``, ``rlloss.functional.__all__`` and ``rlloss.data.__all__``, and the
README's links into the site. The slow one builds the site with ``mkdocs build --strict``,
serves it on 127.0.0.1 and opens it in headless Chromium (Debian's ``chromium``): the home page
and ``ClipPPOLoss``'s API page as a reader sees them (title, navigation, the class signature,
the search box, its example as a code block, its keys table, its tutorial link), the equations of a few API pages typeset (laid out as MathML,
offline), with screenshots written to ``$RLLOSS_ARTIFACTS`` (else the test's tmp dir).
"""

from __future__ import annotations

import functools
import html
import http.server
import importlib.util
import inspect
import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import rlloss

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"


@functools.cache
def _hook():
    """``tools/docs_site.py``, the MkDocs hook that generates the API pages (needs no MkDocs)."""
    spec = importlib.util.spec_from_file_location("docs_site", ROOT / "tools" / "docs_site.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _public(module) -> set[str]:
    return {
        f"{module.__name__}.{name}"
        for name in module.__all__
        if type(getattr(module, name)).__name__ != "module"
    }


def test_every_public_name_has_an_api_entry():
    documented = [name for page in _hook().api_pages() for name in page.names]
    public = _public(rlloss) | _public(rlloss.functional) | _public(rlloss.data)
    assert sorted(set(documented) ^ public) == []
    assert len(documented) == len(set(documented)), "a name documented twice"


def test_api_pages_use_public_paths():
    for page in _hook().api_pages():
        for name in page.names:
            assert f"::: {name}" in page.markdown()
            assert name.rsplit(".", 1)[0] in {"rlloss", "rlloss.functional", "rlloss.data"}


def _losses_and_estimators() -> list[type]:
    return [
        obj
        for obj in (getattr(rlloss, name) for name in rlloss.__all__)
        if isinstance(obj, type)
        and issubclass(obj, (rlloss.LossModule, rlloss.ValueEstimator))
        and obj not in (rlloss.LossModule, rlloss.ValueEstimator)
    ]


def test_every_loss_and_estimator_page_has_its_keys_table():
    """Generated from ``_AcceptedKeys``: one row per key, each with its default and meaning."""
    import dataclasses

    classes = _losses_and_estimators()
    assert len(classes) >= 50
    for cls in classes:
        page = _hook().ApiPage(f"api/{cls.__name__}.md", "", (), (f"rlloss.{cls.__name__}",))
        markdown = page.markdown()
        assert f"## Keys of `{cls.__name__}`" in markdown, cls
        for field in dataclasses.fields(cls._AcceptedKeys):
            row = re.search(
                rf"^\| `{field.name}` \| (.*?) \| (read|written|read or written|not used) \| "
                rf"(.*?) \| (.*) \|$",
                markdown,
                re.M,
            )
            assert row, (cls, field.name)
            assert row.group(4).strip() not in ("", "&nbsp;"), (cls, field.name, "no meaning")
            shape = row.group(3)
            assert re.fullmatch(r"`\[[^`]*\]`( or `\[[^`]*\]`)*|\*not used\*", shape), (
                cls,
                field.name,
                f"no shape: {shape!r} (end the field's comment with its shape, e.g. [*B, 1])",
            )


def test_keys_table_reads_roles_and_shapes_from_the_field_comments():
    rows = {row.name: row for row in _hook().key_rows(rlloss.ClipPPOLoss)}
    assert rows["advantage"].role == "read" and rows["advantage"].shape == "[*B, 1]"
    assert rows["sample_log_prob"].shape == "[*B]"
    rows = {row.name: row for row in _hook().key_rows(rlloss.GAE)}
    assert rows["advantage"].role == "written"
    assert rows["value"].role == "read or written"
    rows = {row.name: row for row in _hook().key_rows(rlloss.IQLLoss)}
    assert rows["state_action_value"].role == "read"  # "written by the Q networks": read here
    assert rows["priority"].role == "written"
    assert rows["log_prob"].role == rows["log_prob"].shape == "not used"  # TorchRL's name only
    rows = {row.name: row for row in _hook().key_rows(rlloss.DQNLoss)}
    assert rows["action"].shape == "[*B] or [*B, A]"  # index or one-hot


def _equations_as_html(doc: str) -> str:
    """``doc`` as the site renders its Markdown (with pymdownx.arithmatex, as ``mkdocs.yml``
    configures it), its equations typeset by the site's hook."""
    import markdown

    text = markdown.markdown(
        doc,
        extensions=["pymdownx.arithmatex"],
        extension_configs={"pymdownx.arithmatex": {"generic": True}},
    )
    return _hook().latex_to_mathml(text, "docstring")


def test_docstring_equations_are_typeset():
    """Every ``$$...$$`` and ``$...$`` of a public docstring becomes MathML (latex2mathml reads
    it), none is left as raw LaTeX, and the headline losses and estimators state theirs."""
    pytest.importorskip("latex2mathml")
    pytest.importorskip("pymdownx")
    with_equations = set()
    for module in (rlloss, rlloss.functional, rlloss.data):
        for name in module.__all__:
            doc = inspect.getdoc(getattr(module, name)) or ""
            blocks = len(re.findall(r"^\$\$$", doc, re.M)) // 2
            if "$" not in doc:
                continue
            rendered = _equations_as_html(doc)
            typeset = re.findall(r'<div class="arithmatex">(.*?)</div>', rendered, re.S)
            assert len(typeset) == blocks, name
            assert all(
                part.startswith('<math xmlns="http://www.w3.org/1998/Math/MathML" display="block"')
                for part in typeset
            ), name
            assert "$" not in re.sub(r"<math.*?</math>", "", rendered, flags=re.S), name
            assert "\\(" not in rendered and "\\[" not in rendered, name
            if blocks:
                with_equations.add(name)
    # every loss and estimator states its equations, but those whose maths is their parent's
    # (named in their docstring, where the equations are)
    same_maths = {"MAPPOLoss": "ClipPPOLoss", "IPPOLoss": "MAPPOLoss", "DiscreteIQLLoss": "IQLLoss"}
    for cls in _losses_and_estimators():
        if cls.__name__ in same_maths:
            assert f":class:`{same_maths[cls.__name__]}`" in inspect.getdoc(cls).replace(
                "rlloss.", ""
            ), cls
            assert same_maths[cls.__name__] in with_equations | set(same_maths), cls
        else:
            assert cls.__name__ in with_equations, f"{cls.__name__}: no $$ equation"


def test_every_loss_page_cites_its_paper():
    citation = re.compile(r"arXiv:\d{4}\.\d{4,5}|NeurIPS \d{4}|\(\d{4}\b|\b(?:19|20)\d\d\)")
    uncited = [
        cls.__name__
        for cls in _losses_and_estimators()
        if issubclass(cls, rlloss.LossModule) and not citation.search(inspect.getdoc(cls) or "")
    ]
    assert uncited == []


def test_differences_have_a_section_per_class():
    """The page's table of contents finds a class: one ``## `Name``` heading each, every
    heading naming a public class (or a family), no entry left outside a section."""
    text = (ROOT / "docs" / "differences.md").read_text(encoding="utf-8")
    headings = re.findall(r"^## `([\w.]+)`$", text, re.M)
    public = set(rlloss.__all__) | {f"rlloss.data.{n}" for n in rlloss.data.__all__}
    assert len(headings) >= 25 and set(headings) <= public, set(headings) - public
    assert len(headings) == len(set(headings))
    before_first = text.split("\n## ", 1)[0]
    assert not re.search(r"^- ", before_first, re.M), "an entry outside a section"


def test_migration_guide_covers_every_family():
    guide = (ROOT / "docs" / "guides" / "migration.md").read_text(encoding="utf-8")
    losses = {
        cls.__name__ for cls in _losses_and_estimators() if issubclass(cls, rlloss.LossModule)
    }
    assert sorted(n for n in losses if f"`{n}`" not in guide) == []


def test_home_page_lists_every_loss():
    home = (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
    listed = set(re.findall(r"\[rlloss\.(\w+)\]", home))
    losses = {
        cls.__name__ for cls in _losses_and_estimators() if issubclass(cls, rlloss.LossModule)
    }
    assert sorted(losses - listed) == []


def test_loss_pages_link_their_tutorials():
    markdown = _hook().ApiPage("api/ClipPPOLoss.md", "", (), ("rlloss.ClipPPOLoss",)).markdown()
    assert "[`tutorials/ppo_cartpole.py`](../tutorials.md#ppo_cartpolepy)" in markdown


def test_mujoco_losses_link_their_results():
    """PPO's, SAC's and TD3's pages link to their section of the Results page, whose headings
    carry the anchors (kept when rows are added); every MuJoCo tutorial's loss has its section."""
    hook = _hook()
    results = (ROOT / "docs" / "results.md").read_text(encoding="utf-8")
    for algorithm, names in hook.RESULTS_SECTIONS.items():
        assert re.search(rf"^## .*\{{ #{algorithm} \}}$", results, re.M), algorithm
        for name in names:
            page = hook.ApiPage(f"api/{name}.md", "", (), (f"rlloss.{name}",)).markdown()
            assert f"](../results.md#{algorithm})" in page, name
    for tutorial in sorted((ROOT / "tutorials").glob("*_mujoco.py")):
        algorithm = tutorial.stem.removesuffix("_mujoco")
        losses = set(
            re.findall(r"^\s*from rlloss import .*?\b(\w+Loss)\b", tutorial.read_text(), re.M)
        )
        assert losses and losses <= set(hook.RESULTS_SECTIONS[algorithm]), (tutorial.name, losses)


def test_api_pages_link_their_source():
    """Each API page links every name it documents to the site's page of its module's source,
    at a heading that page has (the build's anchor check holds it too)."""
    hook = _hook()
    sources = hook.source_pages(hook.api_pages())
    for page in hook.api_pages():
        markdown = page.markdown()
        for name in page.names:
            link = re.search(
                rf"^- `{re.escape(name)}`: \[`([\w/.]+)`, line (\d+)\]\(([^)#]+)#([\w-]+)\)$",
                markdown,
                re.M,
            )
            assert link, (page.path, name)
            path, line, target, anchor = link.groups()
            assert (ROOT / path).is_file(), path
            source = sources[hook.source_page_path(path)]
            assert f"{{ #{anchor} }}" in source, (name, anchor)
            section = source.split(f"{{ #{anchor} }}", 1)[1].split("\n## ", 1)[0]
            short = name.rsplit(".", 1)[1]
            assert re.search(rf"^(class|def) {short}\b", section, re.M), (name, "not its section")
            assert f'linenums="{line}"' in section or "@" in section, (name, line)
    ppo = sources["source/rlloss/onpolicy/ppo.py.md"]
    assert ppo.count("## class `") >= 3 and "search:\n  exclude: true" in ppo
    code = (ROOT / "rlloss" / "onpolicy" / "ppo.py").read_text(encoding="utf-8").splitlines()
    shown = set(ppo.splitlines())
    assert all(line in shown for line in code), "a line of the module missing on its page"


def _args_rows(obj) -> list[str]:
    """The parameter rows the API page shows for ``obj``: its Google-style ``Args`` entries, as
    mkdocstrings' parser (griffe) reads them, the ``__init__`` docstring merged into the class's."""
    from griffe import Docstring

    doc = inspect.getdoc(obj) or ""
    if inspect.isclass(obj) and "__init__" in vars(obj) and obj.__init__.__doc__:
        doc += "\n\n" + inspect.cleandoc(obj.__init__.__doc__)
    rows = []
    for section in Docstring(doc).parse("google", warnings=False):
        if section.kind.value in ("parameters", "other parameters"):
            rows += [parameter.name for parameter in section.value]
    return rows


def test_parameter_rows_are_parameters():
    """Each ``Args`` entry is one parameter of the signature, so its row shows the signature's
    type and default; while a class still takes a catch-all (``**kwargs``) a name it forwards
    is accepted."""
    pytest.importorskip("griffe")
    wrong = []
    for module in (rlloss, rlloss.functional, rlloss.data):
        for name in module.__all__:
            obj = getattr(module, name)
            if inspect.ismodule(obj) or not callable(obj):
                continue
            try:
                parameters = inspect.signature(obj).parameters
            except (TypeError, ValueError):  # a builtin's (an exception class's): no Args
                assert _args_rows(obj) == [], name
                continue
            catch_all = any(p.kind is p.VAR_KEYWORD for p in parameters.values())
            for row in _args_rows(obj):
                name = row.lstrip("*")  # "**hyperparams" is the catch-all's own row
                if not name.isidentifier() or (name not in parameters and not catch_all):
                    wrong.append(f"{module.__name__}.{name}: {row!r}")
    assert wrong == []


def test_readme_links_into_the_site_resolve():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    generated = {page.path for page in _hook().api_pages()} | {"api/index.md"}
    links = re.findall(r"(?:\]\(|\]: )(docs/[^)\s#]+)", readme)
    assert links, "the README links into the site"
    for link in links:
        relative = link.removeprefix("docs/")
        assert relative in generated or (ROOT / link).is_file(), link


class _RecordingHandler(http.server.SimpleHTTPRequestHandler):
    """Serves the site quietly and records what the browser asked for."""

    requested: list[str]

    def log_message(self, *args):
        pass

    def do_GET(self):
        self.requested.append(self.path)
        super().do_GET()


def _chromium(*args: str, profile: Path, budget_ms: int = 5000) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            f"--user-data-dir={profile}",
            f"--virtual-time-budget={budget_ms}",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=180,
        check=True,
    )


def _text(dom: str) -> str:
    """What a reader reads: the DOM without scripts, styles and tags."""
    dom = re.sub(r"<(script|style)\b.*?</\1>", " ", dom, flags=re.S)
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", dom)))


# API pages whose docstring equations the browser check measures once typeset.
MATH_PAGES = ("api/ClipPPOLoss/", "api/SACLoss/", "api/GAE/")
# and more: a cases environment (KTO), matrices (CrossQ), the widest blocks (VTrace, the
# functional groups of returns and Q-learning targets)
PROBED_PAGES = (
    "api/KTOLoss/",
    "api/CrossQLoss/",
    "api/VTrace/",
    "api/functional/returns/",
    "api/functional/q/",
)


def _math_probe(pages: tuple[str, ...]) -> str:
    """A page of the site's origin that loads each of ``pages`` in a frame and reports, as JSON in
    ``<pre id="probe">``, how the browser laid out their block equations: how many, their CSS
    display ("block math" where MathML is rendered), their widths, for each fraction whether its
    numerator sits above its denominator and for each subscript whether it sits below its base
    (only a MathML layout places them so: raw text would run them along one line)."""
    return (
        "<!doctype html><html><body><script>\n"
        f"const pages = {json.dumps(['/' + page for page in pages])};\n"
        """const probed = {};
let left = pages.length;
for (const page of pages) {
  const frame = document.createElement("iframe");
  frame.style.width = "1280px";
  frame.style.height = "900px";
  frame.onload = () => {
    const doc = frame.contentDocument;
    const blocks = [...doc.querySelectorAll("div.arithmatex > math")];
    const box = (node) => node.getBoundingClientRect();
    probed[page.slice(1)] = {
      blocks: blocks.length,
      display: blocks.map((m) => frame.contentWindow.getComputedStyle(m).display),
      widths: blocks.map((m) => box(m).width),
      fits: blocks.map((m) => m.parentElement.scrollWidth <= m.parentElement.clientWidth + 1),
      fractions: [...doc.querySelectorAll("div.arithmatex mfrac")].map(
        (f) => box(f.children[0]).bottom <= box(f.children[1]).top + 1),
      subscripts: [...doc.querySelectorAll("div.arithmatex msub")].map(
        (s) => box(s.children[1]).bottom > box(s.children[0]).bottom + 1),
    };
    if (--left === 0) {
      const pre = document.createElement("pre");
      pre.id = "probe";
      pre.textContent = JSON.stringify(probed);
      document.body.appendChild(pre);
    }
  };
  frame.src = page;
  document.body.appendChild(frame);
}
</script></body></html>
"""
    )


@pytest.mark.slow
def test_site_builds_strict_and_reads_right_in_chromium(tmp_path):
    for module in ("mkdocs", "material", "mkdocstrings_handlers.python"):
        if importlib.util.find_spec(module.split(".")[0]) is None:
            pytest.skip(f'{module} is not installed (pip install ".[docs]")')
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is missing (apt-get install chromium)")

    site = tmp_path / "site"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
        "NO_MKDOCS_2_WARNING": "1",
    }
    build = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert build.returncode == 0, build.stdout + build.stderr
    assert "WARNING" not in build.stdout + build.stderr
    for page in _hook().api_pages():  # every API page was written, under its public path
        built = (site / page.path.removesuffix(".md") / "index.html").read_text(encoding="utf-8")
        for name in page.names:
            assert f'id="{name}"' in built, (page.path, name)

    requested: list[str] = []
    handler = type("Handler", (_RecordingHandler,), {"requested": requested})
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(handler, directory=str(site))
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    artifacts = Path(os.environ.get("RLLOSS_ARTIFACTS") or tmp_path)
    artifacts.mkdir(parents=True, exist_ok=True)
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        home = _chromium("--dump-dom", f"{base}/", profile=tmp_path / "profile-home").stdout
        api = _chromium(
            "--dump-dom", f"{base}/api/ClipPPOLoss/", profile=tmp_path / "profile-api"
        ).stdout
        # the pages with the widest and most varied equations: each laid out and in its column
        # (one page loading them in frames; all API pages at once take minutes here)
        probe_pages = MATH_PAGES + PROBED_PAGES
        (site / "math-probe.html").write_text(_math_probe(probe_pages), encoding="utf-8")
        math = _chromium(
            "--dump-dom",
            f"{base}/math-probe.html",
            profile=tmp_path / "profile-math",
            budget_ms=15_000,
        ).stdout
        screenshots = {}
        for name, url in (
            ("docs-home.png", f"{base}/"),
            ("docs-api-ClipPPOLoss.png", f"{base}/api/ClipPPOLoss/"),
            # the whole page, down to its example, keys table and tutorials
            ("docs-api-ClipPPOLoss-full.png", f"{base}/api/ClipPPOLoss/"),
            # an equation typeset on the site (MathML written at build time)
            ("docs-api-SACLoss-math.png", f"{base}/api/SACLoss/"),
        ):
            screenshots[name] = artifacts / name
            _chromium(
                f"--screenshot={screenshots[name]}",
                "--window-size=1280,3000"
                if name.endswith("-full.png")
                else "--window-size=1280,900",
                url,
                profile=tmp_path / f"profile-{name}",
            )
    finally:
        server.shutdown()
        server.server_close()

    # the home page: its title, the navigation, the search box
    assert re.search(r"<title>\s*rlloss\s*</title>", home)
    home_text = _text(home)
    for entry in (
        "Getting started",
        "Guides",
        "Policy-loss add-ons",
        "Differences from TorchRL",
        "Tutorials",
        "Benchmarks",
        "API reference",
    ):
        assert re.search(rf'class="md-nav__link[^"]*"[^>]*>.*?{re.escape(entry)}', home, re.S), (
            entry
        )
    assert "Correct" in home_text and "Drop-in" in home_text
    assert re.search(r'<input[^>]*class="md-search__input"[^>]*placeholder="Search"', home)
    # search: the page started Material's search worker, which fetched the index, and the index
    # holds the API pages
    assert any(p.startswith("/assets/javascripts/workers/search.") for p in requested), requested
    assert "/search/search_index.json" in requested, requested
    index = json.loads((site / "search" / "search_index.json").read_text(encoding="utf-8"))
    assert any(doc["location"].startswith("api/ClipPPOLoss/") for doc in index["docs"])

    # an API page: its title, the class under its public path, its signature, its docstring
    assert re.search(r"<title>\s*ClipPPOLoss - rlloss\s*</title>", api)
    api_text = _text(api)
    assert "rlloss.ClipPPOLoss" in api_text
    signature = re.search(r"ClipPPOLoss \( (.*?) \)", api_text)
    assert signature, "the class signature"
    for parameter in ("actor_network", "critic_network", "clip_epsilon", "dual_clip"):
        assert parameter in signature.group(1)
    assert "PPO with the clipped surrogate" in api_text
    # its example rendered as code (a highlighted block, not a note), and its keys table
    example = re.search(r"Examples:?</[^>]+>.*?<pre[^>]*>(.*?)</pre>", api, re.S)
    assert example, "the example is a code block"
    assert "from rlloss import ClipPPOLoss" in _text(example.group(1))
    assert 'class="admonition' not in api.split("Examples", 1)[1].split("</pre>", 1)[0]
    keys = re.search(r'id="keys-of-clipppoloss".*?<table>(.*?)</table>', api, re.S)
    assert keys, "the keys table"
    keys_text = _text(keys.group(1))
    for entry in ("advantage", "value_target", "action_log_prob", "read", "[*B, 1]"):
        assert entry in keys_text, entry
    assert "tutorials/ppo_cartpole.py" in api_text  # the link to its tutorial
    assert 'href="../../results.md' not in api and 'href="../../results/#ppo"' in api  # results
    # its source: a link to the module's page on the site, at the class's section
    assert 'href="../../source/rlloss/onpolicy/ppo.py/#def-ClipPPOLoss"' in api
    source = (site / "source/rlloss/onpolicy/ppo.py/index.html").read_text(encoding="utf-8")
    assert 'id="def-ClipPPOLoss"' in source and "class ClipPPOLoss" in _text(source)
    assert re.search(r'<input[^>]*class="md-search__input"', api)
    assert "On-policy losses" in api_text  # the API section of the navigation

    # the equations: typeset by the browser, offline (the site loads no math script), on each
    # page probed: a block equation laid out as math, its fractions stacked, its subscripts low
    probed = json.loads(html.unescape(re.search(r'<pre id="probe">(.*?)</pre>', math, re.S)[1]))
    assert sorted(probed) == sorted(probe_pages), "a page the probe did not measure"
    for page in MATH_PAGES:
        assert probed[page]["blocks"] >= 1 and probed[page]["subscripts"], (page, probed[page])
    for page in probe_pages:
        found = probed[page]
        assert found["blocks"] >= 1, (page, found)
        assert all(display == "block math" for display in found["display"]), (page, found)
        assert min(found["widths"]) > 30, (page, found)
        assert all(found["fits"]), (page, "an equation wider than the text column")
        assert all(found["fractions"]), (page, "a fraction's terms side by side")
        assert all(found["subscripts"]), (page, "subscripts not lowered")
    assert not any("mathjax" in p.lower() or "katex" in p.lower() for p in requested), requested

    for path in screenshots.values():
        data = path.read_bytes()
        assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 10_000, path
        print(f"screenshot: {path}")
