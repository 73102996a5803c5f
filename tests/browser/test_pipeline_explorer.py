"""Notebook 05 in a real JupyterLab: run it, move the explorer's slider, see the chart change."""

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.slow]

NOTEBOOK = "notebooks/05_pipeline.ipynb"


def _explorer_state(page):
    out = page.locator(".widget-output").filter(has_text="bubble fraction").first
    src = out.locator("img").first.get_attribute("src")
    text = out.text_content()
    line = text[text.index("bubble fraction") :].splitlines()[0]
    return src, line


def test_explorer_redraws_when_the_slider_moves(lab, lab_server, page):
    page.console_log = []  # every console message, to explain a failure
    page.on("console", lambda m: page.console_log.append(f"{m.type}: {m.text}"))
    failed = []  # HTTP errors, so that a console "404" says which resource
    page.on("response", lambda r: r.status >= 400 and failed.append(f"{r.status} {r.url}"))
    lab.run_to_the_end(
        lab_server.copy(NOTEBOOK, {"SMOKE": True}), "notebook body ran in", timeout=240_000
    )

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
    lab.artefact("pipeline_explorer_console.txt").write_text("\n".join(page.console_log) + "\n")
    assert shot.stat().st_size > 10_000
    assert readout_after != readout_before, (readout_before, readout_after)
    assert src_after != src_before
    assert line_after != line_before, f"printed figures did not change: {line_after}"
    assert not page.console_errors, (page.console_errors, failed)
