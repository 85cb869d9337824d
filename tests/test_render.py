#!/usr/bin/env python3
"""Pictures as a browser draws them: `test_render.py PATH_TO_DTENSOR_PLAN`.

Renders a layout picture, a plan picture and the plan's HTML page with
headless Chromium (Debian's chromium-headless-shell, which the README's test
command installs) to PNG, and checks what a person would see: the render is
not blank, and each rank's colour from the SVG covers a visible area, with no
other strong colour as large. The page's hover is driven in the browser too:
a mouseenter on each tile shows that tile's <title> in the panel and outlines
it, a mouseleave undoes both, and the page loads with no network request
(Chromium's net log). Prints one `case:` line per test
(tests/script_cases.py): where no Chromium can be found, each test is a
skip saying so, and the script exits 77 (meson's skip).

Standard library only: the PNG is decoded here (zlib and the five filters).
"""
import colorsys
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import unittest
import xml.etree.ElementTree as ET
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from script_cases import Cases, run_unittest  # noqa: E402

PLAN = None
CHROMIUM = None
SVG_NS = "{http://www.w3.org/2000/svg}"


def find_chromium():
    for name in ("chromium-headless-shell", "chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def decode_png(path):
    """(width, height, rows of (r, g, b) tuples) of an 8-bit RGB or RGBA PNG."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError(f"{path} is not a PNG")
    pos, idat, header = 8, b"", None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    width, height, depth, colour, _, _, interlace = header
    if depth != 8 or colour not in (2, 6) or interlace:
        raise ValueError(f"{path}: PNG of depth {depth}, colour type {colour}, interlace {interlace} not handled")
    channels = 3 if colour == 2 else 4
    stride = width * channels
    raw = zlib.decompress(idat)
    rows, prev = [], bytearray(stride)
    for y in range(height):
        kind = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - channels] if i >= channels else 0
            b = prev[i]
            c = prev[i - channels] if i >= channels else 0
            if kind == 1:
                line[i] = (line[i] + a) & 255
            elif kind == 2:
                line[i] = (line[i] + b) & 255
            elif kind == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append([tuple(line[x * channels:x * channels + 3]) for x in range(width)])
        prev = line
    return width, height, rows


def hsl_rgb(text):
    """'hsl(210,62%,58%)' -> (r, g, b) in 0..255."""
    h, s, l = (float(v) for v in re.match(r"hsl\(([\d.]+),([\d.]+)%,([\d.]+)%\)", text).groups())
    r, g, b = colorsys.hls_to_rgb(h / 360, l / 100, s / 100)
    return tuple(round(v * 255) for v in (r, g, b))


def strong_colours(rows, share):
    """Saturated colours covering at least `share` of the pixels: {rgb: count}."""
    counts = {}
    for row in rows:
        for px in row:
            if max(px) - min(px) > 40:
                counts[px] = counts.get(px, 0) + 1
    total = sum(len(r) for r in rows)
    return {c: n for c, n in counts.items() if n >= share * total}


# Appended to a copy of the page: after load, a real mouseenter then mouseleave
# on every tile, what the panel and the tile's class showed each time, as JSON
# in <pre id="hover-results"> for --dump-dom to carry out.
HOVER_PROBE = """<script>
window.addEventListener('load', function () {
  var panel = document.getElementById('hover');
  var results = [];
  document.querySelectorAll('g.tile').forEach(function (tile) {
    tile.dispatchEvent(new MouseEvent('mouseenter'));
    var entered = {text: panel.textContent, hovered: tile.classList.contains('hovered')};
    tile.dispatchEvent(new MouseEvent('mouseleave'));
    results.push({ranks: tile.getAttribute('data-ranks'), panel: tile.getAttribute('data-panel'),
                  offset: tile.getAttribute('data-offset'), text: entered.text, hovered: entered.hovered,
                  left_text: panel.textContent, left_hovered: tile.classList.contains('hovered')});
  });
  var pre = document.createElement('pre');
  pre.id = 'hover-results';
  pre.textContent = JSON.stringify(results);
  document.body.appendChild(pre);
});
</script>"""


def net_log_urls(path):
    """Every URL in a Chromium --log-net-log file's event parameters."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    try:
        log = json.loads(text)
    except json.JSONDecodeError:  # a browser that exits before closing the log leaves it open
        try:
            log = json.loads(text.rstrip().rstrip(",") + "]}")
        except json.JSONDecodeError:  # ... or cut off inside an event: every "url" value in the text
            return sorted(set(re.findall(r'"url"\s*:\s*"([^"]*)"', text)))
    return sorted({e["params"]["url"] for e in log.get("events", []) if "url" in e.get("params", {})})


def near(a, b, tolerance=3):
    return all(abs(x - y) <= tolerance for x, y in zip(a, b))


class Render(unittest.TestCase):
    def setUp(self):
        if CHROMIUM is None:
            self.skipTest("no Chromium (chromium-headless-shell) on PATH")
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)

    def plan(self, *args):
        proc = subprocess.run([PLAN, *args], capture_output=True, text=True, timeout=60)
        self.assertEqual(proc.returncode, 0, proc.stderr)

    def render(self, source, width, height):
        png = os.path.join(self.tmp.name, os.path.basename(source) + ".png")
        cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--hide-scrollbars",
               f"--window-size={width},{height}", f"--screenshot={png}", "file://" + source]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        self.assertTrue(os.path.exists(png), f"{' '.join(cmd)} wrote no PNG: {proc.stderr[-2000:]}")
        return decode_png(png)

    def dump_dom(self, source, *flags):
        """The DOM after load (scripts run) as Chromium's --dump-dom prints it."""
        cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
               "--virtual-time-budget=5000", *flags, "--dump-dom", "file://" + source]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        self.assertEqual(proc.returncode, 0, f"{' '.join(cmd)}: {proc.stderr[-2000:]}")
        return proc.stdout

    def svg_size_and_fills(self, path):
        root = ET.parse(path).getroot()
        fills = {r.get("fill") for r in root.iter(SVG_NS + "rect") if r.get("class") == "box"}
        return int(float(root.get("width"))), int(float(root.get("height"))), fills

    def check_not_blank(self, rows, what):
        pixels = [px for row in rows for px in row]
        drawn = sum(1 for px in pixels if px != (255, 255, 255))
        self.assertGreater(drawn, 0.05 * len(pixels), f"{what}: only {drawn} of {len(pixels)} pixels drawn")

    def test_layout_picture_shows_each_rank_colour(self):
        svg = os.path.join(self.tmp.name, "layout.svg")
        # No steps: the picture is the layout alone. 2x3 mesh, both dims sharding: 6 colours.
        self.plan("--mesh", "2x3", "--shape", "8,9", "--from", "S(0),S(1)", "--to", "S(0),S(1)", "--svg", svg)
        width, height, fills = self.svg_size_and_fills(svg)
        self.assertEqual(len(fills), 6)
        _, _, rows = self.render(svg, width, height)
        self.check_not_blank(rows, "layout picture")
        big = strong_colours(rows, 0.01)
        for fill in fills:
            want = hsl_rgb(fill)
            self.assertTrue(any(near(c, want) for c in big), f"{fill} = {want} not seen; big colours {sorted(big)}")
        self.assertEqual(len(big), len(fills), f"expected {len(fills)} rank colours, saw {sorted(big)}")

    def test_plan_picture_and_page_render(self):
        svg = os.path.join(self.tmp.name, "plan.svg")
        html = os.path.join(self.tmp.name, "plan.html")
        self.plan("--mesh", "2x2", "--dims", "dp,tp", "--shape", "8,6", "--from", "S(0),P(sum)", "--to", "R,S(1)",
                  "--svg", svg, "--html", html)
        width, height, fills = self.svg_size_and_fills(svg)
        _, _, rows = self.render(svg, width, height)
        self.check_not_blank(rows, "plan picture")
        self.assertGreaterEqual(len(strong_colours(rows, 0.002)), 2)
        _, _, rows = self.render(html, 1280, 900)
        self.check_not_blank(rows, "plan page")
        self.assertGreaterEqual(len(strong_colours(rows, 0.002)), 2)

    def test_page_hover_shows_each_tile_title(self):
        html = os.path.join(self.tmp.name, "uneven.html")
        # 7x10 on a 2x3 mesh: 4+3 rows and 4+4+2 columns, then 5+5 and 3+3+1.
        self.plan("--mesh", "2x3", "--dims", "dp,tp", "--shape", "7,10", "--from", "S(0),S(1)", "--to", "S(1),S(0)",
                  "--html", html)
        with open(html, encoding="utf-8") as f:
            page = f.read()
        # The tiles and their titles from the page itself, not the browser: the inline SVG is XML.
        svg = ET.fromstring(page[page.index("<svg"):page.rindex("</svg>") + len("</svg>")])
        tiles = [g for g in svg.iter(SVG_NS + "g") if "tile" in (g.get("class") or "").split()]
        self.assertGreater(len(tiles), 0, "no g.tile in the page")
        titles = [g.find(SVG_NS + "title").text for g in tiles]
        self.assertGreater(len({g.get("data-size") for g in tiles}), 1, "the shards are not uneven")
        idle = re.search(r'<div id="hover">([^<]*)</div>', page).group(1)

        # The page as it is opens with no network request at all.
        net_log = os.path.join(self.tmp.name, "net.json")
        self.dump_dom(html, f"--log-net-log={net_log}")
        self.assertEqual(net_log_urls(net_log), [], "the page fetched something")

        probe = os.path.join(self.tmp.name, "uneven-probe.html")
        self.assertEqual(page.count("</body>"), 1)
        with open(probe, "w", encoding="utf-8") as f:
            f.write(page.replace("</body>", HOVER_PROBE + "</body>"))
        dom = self.dump_dom(probe)
        found = re.search(r'<pre id="hover-results">(.*?)</pre>', dom, re.S)
        self.assertIsNotNone(found, f"the probe wrote no results: {dom[-2000:]}")
        seen = json.loads(found.group(1).replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&"))
        self.assertEqual(len(seen), len(tiles), "the browser saw a different number of tiles")
        for tile, title, got in zip(tiles, titles, seen):
            where = f"tile ranks {tile.get('data-ranks')} offset {tile.get('data-offset')} panel {tile.get('data-panel')}"
            with self.subTest(tile=where):
                self.assertEqual((got["ranks"], got["offset"], got["panel"]),
                                 (tile.get("data-ranks"), tile.get("data-offset"), tile.get("data-panel")))
                # The title as layout_svg draws it: holders, then offset and size, then bytes.
                self.assertRegex(title, r"^r\d+ \([\d,]+\)(, r\d+ \([\d,]+\))*\n"
                                        r"offset \[[\d,]+\] size \[[\d,]+\]\n[\d.e+]+ (B|[KMGT]iB) per rank$")
                self.assertEqual(got["text"], title, f"{where}: the panel on mouseenter")
                self.assertTrue(got["hovered"], f"{where}: not outlined on mouseenter")
                self.assertFalse(got["left_hovered"], f"{where}: still outlined after mouseleave")
                self.assertEqual(got["left_text"], idle, f"{where}: the panel after mouseleave")


def main():
    global PLAN, CHROMIUM
    PLAN = os.path.abspath(sys.argv[1])
    CHROMIUM = find_chromium()
    cases = Cases()
    run_unittest(cases)
    return cases.finish()


if __name__ == "__main__":
    sys.exit(main())
