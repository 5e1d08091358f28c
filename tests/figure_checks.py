"""What every test of a figure checks: the image a notebook shows keeps every label."""

import io

import matplotlib
import matplotlib.legend
import matplotlib.text
from PIL import Image


def assert_nothing_is_cropped(figure):
    """The image a notebook shows (tight bounding box, as the inline backend saves it) keeps every artist.

    Every artist lies inside the figure, and the tight crop is the figure itself
    (within the 0.1-inch pad): a key placed outside the figure and left out of
    the layout would make the saved image narrower than ``figsize * dpi``.
    """
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()
    inside = figure.bbox.padded(2)
    # Tick labels outside the view limits exist but are never drawn; the axes' own extent covers the drawn ones.
    ticks = {id(label) for ax in figure.axes for axis in (ax.xaxis, ax.yaxis)
             for tick in axis.get_major_ticks() + axis.get_minor_ticks() for label in (tick.label1, tick.label2)}
    for ax in figure.axes:
        extent = ax.get_tightbbox(renderer)
        assert inside.contains(extent.x0, extent.y0) and inside.contains(extent.x1, extent.y1), ax
    for artist in figure.findobj(lambda a: isinstance(a, (matplotlib.text.Text, matplotlib.legend.Legend))):
        if id(artist) in ticks:
            continue
        if artist.get_visible() and (not isinstance(artist, matplotlib.text.Text) or artist.get_text()):
            extent = artist.get_window_extent(renderer)
            assert inside.contains(extent.x0, extent.y0) and inside.contains(extent.x1, extent.y1), artist
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", bbox_inches="tight", dpi=figure.dpi)
    width, height = Image.open(io.BytesIO(buffer.getvalue())).size
    expected_width, expected_height = figure.get_size_inches() * figure.dpi
    assert width >= 0.93 * expected_width and height >= 0.93 * expected_height, (width, height, expected_width)
