"""Notebook 05 in a real JupyterLab: run it, move the explorer's slider, see the chart change."""

from pathlib import Path

import pytest

ARTEFACTS = Path(__file__).resolve().parents[2] / "build" / "test-artefacts"

pytestmark = [pytest.mark.browser, pytest.mark.slow]

NOTEBOOK = "notebooks/05_pipeline.ipynb"


def _explorer_state(page):
    out = page.locator(".widget-output").filter(has_text="bubble fraction").first
    src = out.locator("img").first.get_attribute("src")
    text = out.text_content()
    line = text[text.index("bubble fraction") :].splitlines()[0]
    return src, line


def _kernel_status(page) -> str:
    indicator = page.locator(".jp-Notebook-ExecutionIndicator").first
    return indicator.get_attribute("data-status") if indicator.count() else "(no indicator)"


def _start_run_all(lab, page, attempts: int = 3) -> None:
    """Run All, and check that the cells really started.

    Run All acts on the *current* notebook. Under load the tab can be on screen before
    JupyterLab has made it current; the menu command then does nothing and the test
    would wait for a run that never began. So: click into the notebook first, and
    retry if no prompt shows [*] or a number within 30 s.
    """
    started = """() => [...document.querySelectorAll('.jp-InputArea-prompt')]
                     .some(p => /\\[(\\*|\\d+)\\]/.test(p.textContent))"""
    for attempt in range(attempts):
        page.locator(".jp-Notebook .jp-Cell").first.click()
        lab.run_all()
        try:
            page.wait_for_function(started, timeout=30_000)
            return
        except Exception:
            if attempt == attempts - 1:
                raise


def _run_to_the_end(lab, page, name):
    """Run All and wait for the last cell's line; on a timeout, say which cell failed."""
    lab.open(name)
    _start_run_all(lab, page)
    try:
        lab.wait_for_text("notebook body ran in", timeout=240_000)
    except Exception as e:
        ARTEFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTEFACTS / "pipeline_explorer_failed.png"), full_page=True)
        errors = page.locator(".jp-OutputArea-output[data-mime-type*='stderr']").all_text_contents()
        raise AssertionError(
            f"notebook 05 did not finish in the browser: {errors[-3:]}; "
            f"kernel {_kernel_status(page)}; console: {page.console_log[-10:]}"
        ) from e
    lab.wait_idle()


def test_explorer_redraws_when_the_slider_moves(lab, lab_server, page):
    page.console_log = []  # every console message, to explain a failure
    page.on("console", lambda m: page.console_log.append(f"{m.type}: {m.text}"))
    failed = []  # HTTP errors, so that a console "404" says which resource
    page.on("response", lambda r: r.status >= 400 and failed.append(f"{r.status} {r.url}"))
    _run_to_the_end(lab, page, lab_server.copy(NOTEBOOK, {"SMOKE": True}))

    explorer = page.locator(".widget-vbox").filter(has=page.locator(".widget-slider")).first
    explorer.scroll_into_view_if_needed()
    src_before, line_before = _explorer_state(page)
    assert src_before and src_before.startswith("data:image/png")
    slider = explorer.locator(".widget-slider").first  # "stages p"
    readout_before = slider.locator(".widget-readout").inner_text()

    slider.locator(".noUi-handle").click()
    page.keyboard.press("ArrowRight")
    page.wait_for_function(
        """([before]) => {
            const out = [...document.querySelectorAll('.widget-output')]
                .find(o => o.textContent.includes('bubble fraction'));
            const img = out && out.querySelector('img');
            return img && img.src !== before;
        }""",
        arg=[src_before],
        timeout=30_000,
    )
    src_after, line_after = _explorer_state(page)
    readout_after = slider.locator(".widget-readout").inner_text()

    shot = lab.screenshot(explorer, "pipeline_explorer.png")
    # kept with the screenshot: should a console error ever appear, its neighbours say when
    (ARTEFACTS / "pipeline_explorer_console.txt").write_text("\n".join(page.console_log) + "\n")
    assert shot.stat().st_size > 10_000
    assert readout_after != readout_before, (readout_before, readout_after)
    assert src_after != src_before
    assert line_after != line_before, f"printed figures did not change: {line_after}"
    assert not page.console_errors, (page.console_errors, failed)
