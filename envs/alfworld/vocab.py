"""ALFRED/ALFWorld vocabulary: object and receptacle types, affordances, rooms and goal phrasing.

Types use ALFRED's CamelCase names (``"SinkBasin"``); the text shows them lowercased
(``"sinkbasin 1"``), as ALFWorld does. Every object and receptacle type of ALFWorld's own lists
(``alfworld.gen.constants``: ``OBJECTS``, ``RECEPTACLES``) is here, sliced variants aside (ALFWorld's
text games leave the slicing tasks out), with ALFWorld's affordances: which objects can be cleaned
(in a sink basin), heated (in a microwave), cooled (in a fridge) or toggled (the two lamps), which
receptacles open, and which object types each receptacle type can hold. Which objects can be taken
follows AI2-THOR. ``tests/envs/alfworld/test_alfworld_vocab.py`` checks the tables against the
installed ``alfworld`` package when it is there.
"""

from __future__ import annotations

__all__ = [
    "APPLIANCE",
    "CLEANABLE",
    "COOLABLE",
    "FIXTURES",
    "FLOORPLANS",
    "GOAL_TEMPLATES",
    "HEATABLE",
    "LAMP_SURFACES",
    "OBJECT_TYPES",
    "OPENABLE",
    "PICKUPABLE",
    "RECEPTACLE_NAMES",
    "RECEPTACLE_OBJECTS",
    "RECEPTACLE_TYPES",
    "ROOMS",
    "ROOM_LAMPS",
    "ROOM_OBJECTS",
    "SLICEABLE",
    "START_HOMES",
    "TASK_TYPES",
    "TOGGLEABLE",
    "UNSEEN_FLOORPLANS",
    "room_of_floorplan",
    "type_from_name",
]

TASK_TYPES: tuple[str, ...] = (
    "pick_and_place_simple",
    "look_at_obj_in_light",
    "pick_clean_then_place_in_recep",
    "pick_heat_then_place_in_recep",
    "pick_cool_then_place_in_recep",
    "pick_two_obj_and_place",
)

# The appliance each transforming task needs, and the state it sets.
APPLIANCE: dict[str, tuple[str, str]] = {
    "pick_clean_then_place_in_recep": ("SinkBasin", "clean"),
    "pick_heat_then_place_in_recep": ("Microwave", "heat"),
    "pick_cool_then_place_in_recep": ("Fridge", "cool"),
}

# ALFWorld's two phrasings per task type ({o}: object, {r}: receptacle, {l}: lamp).
GOAL_TEMPLATES: dict[str, tuple[str, str]] = {
    "pick_and_place_simple": ("put a {o} in {r}.", "put some {o} on {r}."),
    "look_at_obj_in_light": ("look at {o} under the {l}.", "examine the {o} with the {l}."),
    "pick_clean_then_place_in_recep": ("put a clean {o} in {r}.", "clean some {o} and put it in {r}."),
    "pick_heat_then_place_in_recep": ("put a hot {o} in {r}.", "heat some {o} and put it in {r}."),
    "pick_cool_then_place_in_recep": ("put a cool {o} in {r}.", "cool some {o} and put it in {r}."),
    "pick_two_obj_and_place": ("put two {o} in {r}.", "find two {o} and put them in {r}."),
}

# ------------------------------------------------------------------------------- ALFWorld's types
# Every type in ALFWorld's object list (alfworld.gen.constants.OBJECTS, sliced variants aside) and
# its receptacle list. Static receptacles are receptacles here; the movable receptacles (bowl, box,
# cup, mug, pan, plate, pot) are objects, as ALFWorld's text games treat them.
RECEPTACLE_NAMES: tuple[str, ...] = (
    "ArmChair", "BathtubBasin", "Bed", "Cabinet", "Cart", "CoffeeMachine", "CoffeeTable", "CounterTop", "Desk",
    "DiningTable", "Drawer", "Dresser", "Fridge", "GarbageCan", "HandTowelHolder", "LaundryHamper", "Microwave",
    "Ottoman", "PaintingHanger", "Safe", "Shelf", "SideTable", "SinkBasin", "Sofa", "StoveBurner", "TVStand",
    "Toaster", "Toilet", "ToiletPaperHanger", "TowelHolder",
)
# Objects an agent can take (AI2-THOR's pickupable types).
PICKUPABLE: frozenset[str] = frozenset({
    "AlarmClock", "Apple", "BaseballBat", "BasketBall", "Book", "Boots", "Bowl", "Box", "Bread", "ButterKnife",
    "CD", "Candle", "CellPhone", "Cloth", "CreditCard", "Cup", "DishSponge", "Egg", "Fork", "Glassbottle",
    "HandTowel", "Kettle", "KeyChain", "Knife", "Ladle", "Laptop", "Lettuce", "Mug", "Newspaper", "Pan",
    "PaperTowel", "PaperTowelRoll", "Pen", "Pencil", "PepperShaker", "Pillow", "Plate", "Plunger", "Pot", "Potato",
    "RemoteControl", "SaltShaker", "ScrubBrush", "SoapBar", "SoapBottle", "Spatula", "Spoon", "SprayBottle",
    "Statue", "TeddyBear", "TennisRacket", "TissueBox", "ToiletPaper", "ToiletPaperRoll", "Tomato", "Towel", "Vase",
    "Watch", "WateringCan", "WineBottle",
})
# ALFWorld's toggleable objects (the lamps of look_at_obj_in_light).
TOGGLEABLE: frozenset[str] = frozenset({"DeskLamp", "FloorLamp"})
# Fixtures: objects ALFWorld knows that can be neither taken nor toggled.
FIXTURES: frozenset[str] = frozenset({
    "Bathtub", "Blinds", "Chair", "Curtains", "Footstool", "HousePlant", "LaundryHamperLid", "LightSwitch",
    "Mirror", "Painting", "Poster", "ShowerDoor", "ShowerGlass", "Sink", "StoveKnob", "Television", "Window",
})
OBJECT_TYPES: frozenset[str] = PICKUPABLE | TOGGLEABLE | FIXTURES

# ALFWorld's affordances (alfworld.gen.constants.VAL_ACTION_OBJECTS, sliced variants aside).
CLEANABLE: frozenset[str] = frozenset({
    "Apple", "Bowl", "ButterKnife", "Cloth", "Cup", "DishSponge", "Egg", "Fork", "Kettle", "Knife", "Ladle",
    "Lettuce", "Mug", "Pan", "Plate", "Pot", "Potato", "SoapBar", "Spatula", "Spoon", "Tomato"})
HEATABLE: frozenset[str] = frozenset({"Apple", "Bread", "Cup", "Egg", "Mug", "Plate", "Potato", "Tomato"})
COOLABLE: frozenset[str] = frozenset({
    "Apple", "Bowl", "Bread", "Cup", "Egg", "Lettuce", "Mug", "Pan", "Plate", "Pot", "Potato", "Tomato",
    "WineBottle"})
SLICEABLE: frozenset[str] = frozenset({"Apple", "Bread", "Egg", "Lettuce", "Potato", "Tomato"})
# Objects that ALFWorld's grammar describes as "This is a normal X. In it, you see ..." (its movable receptacles).
RECEPTACLE_OBJECTS: frozenset[str] = frozenset({"Bowl", "Box", "Cup", "Mug", "Pan", "Plate", "Pot"})

_TABLES = frozenset({
    "AlarmClock", "Apple", "BaseballBat", "BasketBall", "Book", "Bowl", "Box", "Bread", "ButterKnife", "CD", "Candle",
    "CellPhone", "Cloth", "CreditCard", "Cup", "DishSponge", "Egg", "Fork", "Glassbottle", "HandTowel", "Kettle",
    "KeyChain", "Knife", "Ladle", "Laptop", "Lettuce", "Mug", "Newspaper", "Pan", "PaperTowel", "Pen", "Pencil",
    "PepperShaker", "Plate", "Pot", "Potato", "RemoteControl", "SaltShaker", "SoapBar", "SoapBottle", "Spatula",
    "Spoon", "SprayBottle", "Statue", "TennisRacket", "TissueBox", "ToiletPaper", "ToiletPaperRoll", "Tomato", "Vase",
    "Watch", "WateringCan", "WineBottle"})
_DESKS = frozenset({
    "AlarmClock", "BasketBall", "Book", "Bowl", "Box", "CD", "Candle", "CellPhone", "Cloth", "CreditCard", "Cup",
    "Glassbottle", "KeyChain", "Laptop", "Mug", "Newspaper", "Pen", "Pencil", "Plate", "RemoteControl",
    "SprayBottle", "Statue", "TennisRacket", "TissueBox", "ToiletPaper", "ToiletPaperRoll", "Vase", "Watch",
    "WateringCan", "WineBottle"})
_SEATS = frozenset({"BasketBall", "Book", "Box", "CellPhone", "Cloth", "CreditCard", "KeyChain", "Laptop", "Newspaper",
                    "Pillow", "RemoteControl"})

# Receptacle type -> the object types an agent can put in or on it (ALFWorld's VAL_RECEPTACLE_OBJECTS).
RECEPTACLE_TYPES: dict[str, frozenset[str]] = {
    "ArmChair": _SEATS,
    "BathtubBasin": frozenset({"Cloth", "DishSponge", "HandTowel", "SoapBar"}),
    "Bed": frozenset({"BaseballBat", "BasketBall", "Book", "CellPhone", "Laptop", "Newspaper", "Pillow",
                      "TennisRacket"}),
    "Cabinet": frozenset({"Book", "Bowl", "Box", "CD", "Candle", "Cloth", "Cup", "DishSponge", "Glassbottle",
                          "HandTowel", "Kettle", "Ladle", "Mug", "Newspaper", "Pan", "PepperShaker", "Plate", "Plunger",
                          "Pot", "SaltShaker", "SoapBar", "SoapBottle", "SprayBottle", "TissueBox", "ToiletPaper",
                          "ToiletPaperRoll", "Vase", "WateringCan", "WineBottle"}),
    "Cart": frozenset({"Candle", "Cloth", "DishSponge", "HandTowel", "Mug", "PaperTowel", "Plunger", "SoapBar",
                       "SoapBottle", "SprayBottle", "Statue", "TissueBox", "ToiletPaper", "ToiletPaperRoll", "Vase"}),
    "CoffeeMachine": frozenset({"Mug"}),
    "CoffeeTable": _TABLES,
    "CounterTop": _TABLES,
    "Desk": _DESKS | {"SoapBottle"},
    "DiningTable": _TABLES,
    "Drawer": frozenset({"Book", "ButterKnife", "CD", "Candle", "CellPhone", "Cloth", "CreditCard", "DishSponge", "Fork",
                         "HandTowel", "KeyChain", "Knife", "Ladle", "Newspaper", "Pen", "Pencil", "PepperShaker",
                         "RemoteControl", "SaltShaker", "SoapBar", "SoapBottle", "Spatula", "Spoon", "SprayBottle",
                         "TissueBox", "ToiletPaper", "ToiletPaperRoll", "Watch", "WateringCan"}),
    "Dresser": _DESKS,
    "Fridge": frozenset({"Apple", "Bowl", "Bread", "Cup", "Egg", "Glassbottle", "Lettuce", "Mug", "Pan", "Plate", "Pot",
                         "Potato", "Tomato", "WineBottle"}),
    "GarbageCan": frozenset({"Apple", "Bread", "CD", "Cloth", "DishSponge", "Egg", "HandTowel", "Lettuce", "Newspaper",
                             "PaperTowel", "Pen", "Pencil", "Potato", "SoapBar", "SoapBottle", "SprayBottle",
                             "TissueBox", "ToiletPaper", "ToiletPaperRoll", "Tomato", "WineBottle"}),
    "HandTowelHolder": frozenset({"HandTowel"}),
    "LaundryHamper": frozenset({"Cloth"}),
    "Microwave": frozenset({"Apple", "Bowl", "Bread", "Cup", "Egg", "Glassbottle", "Mug", "Plate", "Potato", "Tomato"}),
    "Ottoman": _SEATS,
    "PaintingHanger": frozenset(),
    "Safe": frozenset({"CD", "CellPhone", "CreditCard", "KeyChain", "Statue", "Vase", "Watch"}),
    "Shelf": frozenset({"AlarmClock", "Book", "Bowl", "Box", "CD", "Candle", "CellPhone", "Cloth", "CreditCard", "Cup",
                        "DishSponge", "Glassbottle", "HandTowel", "Kettle", "KeyChain", "Mug", "Newspaper", "PaperTowel",
                        "Pen", "Pencil", "PepperShaker", "Plate", "Pot", "RemoteControl", "SaltShaker", "SoapBar",
                        "SoapBottle", "SprayBottle", "Statue", "TissueBox", "ToiletPaper", "ToiletPaperRoll", "Vase",
                        "Watch", "WateringCan", "WineBottle"}),
    "SideTable": _TABLES,
    "SinkBasin": frozenset({"Apple", "Bowl", "ButterKnife", "Cloth", "Cup", "DishSponge", "Egg", "Fork", "Glassbottle",
                            "HandTowel", "Kettle", "Knife", "Ladle", "Lettuce", "Mug", "Pan", "Plate", "Pot", "Potato",
                            "SoapBar", "Spatula", "Spoon", "Tomato"}),
    "Sofa": _SEATS,
    "StoveBurner": frozenset({"Kettle", "Pan", "Pot"}),
    "TVStand": frozenset({"TissueBox"}),
    "Toaster": frozenset(),  # ALFWorld's toaster takes only bread slices, which its text games leave out
    "Toilet": frozenset({"Candle", "Cloth", "DishSponge", "HandTowel", "Newspaper", "PaperTowel", "SoapBar",
                         "SoapBottle", "SprayBottle", "TissueBox", "ToiletPaper", "ToiletPaperRoll"}),
    "ToiletPaperHanger": frozenset({"ToiletPaper", "ToiletPaperRoll"}),
    "TowelHolder": frozenset({"Towel"}),
}
assert tuple(sorted(RECEPTACLE_TYPES)) == tuple(sorted(RECEPTACLE_NAMES))

# ALFWorld's openable receptacles (OPENABLE_CLASS_LIST; its Box is a movable receptacle here).
# In ALFWorld's games every openable receptacle starts closed.
OPENABLE: frozenset[str] = frozenset({"Cabinet", "Drawer", "Fridge", "Microwave", "Safe"})

# Where generated scenes put things no receptacle "can contain" (lamps, fixtures, and the few
# pickupable types ALFWorld lists for no receptacle): a lamp stands on a desk or beside a sofa...
START_HOMES: dict[str, tuple[str, ...]] = {
    "DeskLamp": ("Desk", "Dresser", "SideTable"),
    "FloorLamp": ("ArmChair", "Dresser", "SideTable", "Sofa"),
    "HousePlant": ("CoffeeTable", "CounterTop", "Desk", "DiningTable", "Dresser", "Shelf", "SideTable"),
    "Television": ("Desk", "Dresser", "TVStand"),
    "TeddyBear": ("ArmChair", "Bed", "Desk", "Dresser"),
    "ScrubBrush": ("Cart", "Toilet"),
    "Towel": ("BathtubBasin", "TowelHolder"),
    "PaperTowelRoll": ("Cart", "CounterTop", "DiningTable", "Shelf", "Toilet"),
}
LAMP_SURFACES: tuple[str, ...] = START_HOMES["DeskLamp"]

ROOMS: dict[str, dict[str, tuple[int, int]]] = {
    # receptacle type -> (min, max) count in a floorplan of that room type
    "kitchen": {
        "Cabinet": (4, 16), "CoffeeMachine": (1, 1), "CounterTop": (1, 3), "DiningTable": (0, 2),
        "Drawer": (1, 10), "Fridge": (1, 1), "GarbageCan": (1, 1), "Microwave": (1, 1), "Shelf": (0, 3),
        "SideTable": (0, 1), "SinkBasin": (1, 1), "StoveBurner": (2, 4), "Toaster": (1, 1),
    },
    "livingroom": {
        "ArmChair": (0, 2), "Cabinet": (0, 4), "CoffeeTable": (0, 2), "DiningTable": (0, 1), "Drawer": (0, 6),
        "Dresser": (0, 1), "GarbageCan": (1, 1), "Ottoman": (0, 1), "Safe": (0, 1), "Shelf": (0, 8),
        "SideTable": (1, 3), "Sofa": (1, 1), "TVStand": (0, 1),
    },
    "bedroom": {
        "ArmChair": (0, 1), "Bed": (1, 1), "Cabinet": (0, 2), "Desk": (0, 1), "Drawer": (1, 8),
        "Dresser": (0, 1), "GarbageCan": (1, 1), "LaundryHamper": (0, 1), "Safe": (0, 1), "Shelf": (0, 6),
        "SideTable": (1, 2),
    },
    "bathroom": {
        "BathtubBasin": (0, 1), "Cabinet": (1, 4), "Cart": (0, 1), "CounterTop": (1, 1), "Drawer": (0, 4),
        "GarbageCan": (1, 1), "HandTowelHolder": (0, 2), "Shelf": (0, 3), "SinkBasin": (1, 2), "Toilet": (1, 1),
        "ToiletPaperHanger": (1, 1), "TowelHolder": (0, 2),
    },
}

# Object types per room type, as ALFWorld's floorplans hold them (alfworld.gen.layouts), the
# non-interactive fixtures (windows, mirrors, light switches...) aside; lamps are placed separately.
ROOM_OBJECTS: dict[str, frozenset[str]] = {
    "kitchen": frozenset({
        "Apple", "Book", "Bowl", "Bread", "ButterKnife", "CellPhone", "CreditCard", "Cup", "DishSponge", "Egg", "Fork",
        "Glassbottle", "HousePlant", "Kettle", "Knife", "Ladle", "Lettuce", "Mug", "Pan", "PaperTowelRoll", "Pen",
        "Pencil", "PepperShaker", "Plate", "Pot", "Potato", "SaltShaker", "SoapBottle", "Spatula", "Spoon",
        "SprayBottle", "Statue", "Tomato", "Vase", "WineBottle"}),
    "livingroom": frozenset({
        "Book", "Bowl", "Box", "Candle", "CellPhone", "CreditCard", "HousePlant", "KeyChain", "Laptop", "Newspaper",
        "Pen", "Pencil", "Pillow", "Plate", "RemoteControl", "Statue", "Television", "TissueBox", "Vase", "Watch",
        "WateringCan"}),
    "bedroom": frozenset({
        "AlarmClock", "BaseballBat", "BasketBall", "Book", "Bowl", "Box", "CD", "CellPhone", "Cloth", "CreditCard",
        "HousePlant", "KeyChain", "Laptop", "Mug", "Pen", "Pencil", "Pillow", "RemoteControl", "Statue", "TeddyBear",
        "Television", "TennisRacket", "TissueBox", "Vase", "Watch"}),
    "bathroom": frozenset({
        "Candle", "Cloth", "DishSponge", "HandTowel", "PaperTowelRoll", "Plunger", "ScrubBrush", "SoapBar",
        "SoapBottle", "SprayBottle", "TissueBox", "ToiletPaper", "Towel"}),
}
# The lamps of a room type (look_at_obj_in_light): living rooms have floor lamps (some a desk lamp
# too), bedrooms desk lamps, as in ALFWorld's floorplans.
ROOM_LAMPS: dict[str, tuple[str, ...]] = {"livingroom": ("FloorLamp", "DeskLamp"), "bedroom": ("DeskLamp",),
                                          "kitchen": (), "bathroom": ()}

# ALFRED's floorplans: kitchens 1-30, living rooms 201-230, bedrooms 301-330, bathrooms 401-430.
FLOORPLANS: tuple[int, ...] = tuple(
    list(range(1, 31)) + list(range(201, 231)) + list(range(301, 331)) + list(range(401, 431))
)
# ALFRED's valid_unseen floorplans; never used by train or valid_seen.
UNSEEN_FLOORPLANS: frozenset[int] = frozenset({10, 219, 308, 424})


def room_of_floorplan(fp: int) -> str:
    """The room type of an ALFRED floorplan number."""
    if 1 <= fp <= 30:
        return "kitchen"
    if 201 <= fp <= 230:
        return "livingroom"
    if 301 <= fp <= 330:
        return "bedroom"
    if 401 <= fp <= 430:
        return "bathroom"
    raise ValueError(f"unknown floorplan {fp}")


_LOWER: dict[str, str] = {t.lower(): t for t in OBJECT_TYPES | set(RECEPTACLE_TYPES)}


def type_from_name(name: str) -> str | None:
    """``"sinkbasin 1"`` -> ``"SinkBasin"``; ``None`` if the name's word is no known type."""
    word = name.rsplit(" ", 1)[0].replace(" ", "")
    return _LOWER.get(word.lower())
