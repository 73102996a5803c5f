"""Notebook 04 in a real JupyterLab: run it, pick Llama 2 70B in the memory explorer, and see
the bars and the verdict change (7B fits 80 GB from ZeRO-1 on 8 GPUs; 70B fits nowhere)."""

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.slow]

NOTEBOOK = "notebooks/04_fsdp_zero.ipynb"
VERDICT = "fits in 80 GB"


def _explorer(page):
    """The explorer's box: the VBox holding the 'Llama 2' dropdown."""
    return page.locator(".widget-vbox").filter(has=page.get_by_text("Llama 2", exact=True)).first


def _state(explorer):
    """(the chart's image source, the verdict line) as the learner sees them."""
    src = explorer.locator(".widget-output img").first.get_attribute("src")
    # text_content, not inner_text: JupyterLab may skip rendering cells scrolled out of view
    verdict = explorer.locator(".widget-html").filter(has_text="fit").first.text_content()
    return src, " ".join(verdict.split())


def test_memory_explorer_redraws_and_says_what_fits(lab, lab_server, page):
    lab.run_to_the_end(lab_server.copy(NOTEBOOK, {"SMOKE": True}), "notebook cells ran in")
    explorer = _explorer(page)
    explorer.scroll_into_view_if_needed()
    src_before, verdict_before = _state(explorer)
    assert src_before and src_before.startswith("data:image/png")
    assert VERDICT in verdict_before and "ZeRO-3" in verdict_before, verdict_before
    assert "ZeRO-0" not in verdict_before, verdict_before  # 7B under DDP needs > 80 GB

    explorer.locator(".widget-dropdown", has_text="Llama 2").locator("select").select_option("70B")
    page.wait_for_function(  # the chart and the verdict both redrawn
        """([before]) => [...document.querySelectorAll('.widget-vbox .widget-output img')]
                .some(img => img.src !== before)
            && [...document.querySelectorAll('.widget-html')]
                .some(h => h.textContent.includes('nothing fits'))""",
        arg=[src_before],
        timeout=30_000,
    )
    src_after, verdict_after = _state(explorer)
    shot = lab.screenshot(explorer, "memory_explorer.png")
    assert shot.stat().st_size > 10_000
    assert src_after != src_before
    assert "nothing fits" in verdict_after, verdict_after  # 70B on 8 GPUs: no stage fits
    assert not page.console_errors, page.console_errors
