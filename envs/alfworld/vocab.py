"""ALFRED/ALFWorld vocabulary: object and receptacle types, affordances, rooms and goal phrasing.

Types use ALFRED's CamelCase names (``"SinkBasin"``); the text shows them lowercased
(``"sinkbasin 1"``), as ALFWorld does. The affordance tables follow ALFRED's: which objects can
be cleaned (in a sink basin), heated (in a microwave), cooled (in a fridge) or toggled, and which
receptacle types can hold which object types.
"""

from __future__ import annotations

__all__ = [
    "APPLIANCE",
    "CLEANABLE",
    "COOLABLE",
    "FLOORPLANS",
    "GOAL_TEMPLATES",
    "HEATABLE",
    "LAMP_SURFACES",
    "OBJECT_TYPES",
    "OPENABLE",
    "RECEPTACLE_OBJECTS",
    "RECEPTACLE_TYPES",
    "ROOMS",
    "ROOM_OBJECTS",
    "SLICEABLE",
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

_FOOD = {"Apple", "Bread", "Egg", "Lettuce", "Potato", "Tomato"}
_DISHES = {"Bowl", "Cup", "Mug", "Plate"}
_COOKWARE = {"Kettle", "Pan", "Pot"}
_UTENSILS = {"ButterKnife", "Fork", "Knife", "Ladle", "Spatula", "Spoon"}
_CONDIMENTS = {"PepperShaker", "SaltShaker"}
_BATH = {"Candle", "Cloth", "DishSponge", "SoapBar", "SoapBottle", "SprayBottle", "ToiletPaper", "TissueBox"}
_SMALL = {"CD", "CellPhone", "CreditCard", "KeyChain", "Pen", "Pencil", "Watch"}
_DECOR = {"Statue", "Vase"}
_MEDIA = {"Book", "Box", "Laptop", "Newspaper", "RemoteControl"}
_SPORTS = {"BaseballBat", "BasketBall", "TennisRacket"}

CLEANABLE: frozenset[str] = frozenset(_FOOD - {"Bread"} | _DISHES | _COOKWARE | _UTENSILS | {"Cloth", "DishSponge", "SoapBar"})
HEATABLE: frozenset[str] = frozenset({"Apple", "Bread", "Cup", "Egg", "Mug", "Plate", "Potato", "Tomato"})
COOLABLE: frozenset[str] = frozenset(_FOOD | _DISHES | {"Pan", "Pot", "WineBottle"})
SLICEABLE: frozenset[str] = frozenset({"Apple", "Bread", "Lettuce", "Potato", "Tomato"})
TOGGLEABLE: frozenset[str] = frozenset({"DeskLamp"})
# Objects that ALFWorld's grammar describes as "This is a normal X. In it, you see ...".
RECEPTACLE_OBJECTS: frozenset[str] = frozenset({"Bowl", "Box", "Cup", "Mug", "Pan", "Plate", "Pot"})

_SURFACE_LIVING = _SMALL | _DECOR | _MEDIA | {"AlarmClock", "Bowl", "Candle", "Cup", "Mug", "Plate", "TissueBox"}

# Receptacle type -> object types it can hold (ALFRED's canContain).
RECEPTACLE_TYPES: dict[str, frozenset[str]] = {
    k: frozenset(v)
    for k, v in {
        "ArmChair": _MEDIA | {"CellPhone", "CreditCard", "KeyChain", "Pillow", "Watch"},
        "BathtubBasin": {"Cloth", "DishSponge", "HandTowel", "SoapBar", "SoapBottle"},
        "Bed": _SPORTS | {"Book", "CellPhone", "CreditCard", "KeyChain", "Laptop", "Newspaper", "Pillow",
                          "RemoteControl", "TeddyBear"},
        "Cabinet": _DISHES | _COOKWARE | _UTENSILS | _CONDIMENTS | _BATH | _DECOR | _SMALL
        | {"Book", "Box", "Newspaper", "RemoteControl", "WineBottle", "HandTowel", "Towel"},
        "Cart": _BATH | {"HandTowel", "PaperTowelRoll", "Towel"},
        "CoffeeMachine": {"Mug"},
        "CoffeeTable": _SURFACE_LIVING | {"WateringCan"},
        "CounterTop": _FOOD | _DISHES | _COOKWARE | _UTENSILS | _CONDIMENTS | _BATH | _DECOR
        | {"CellPhone", "CreditCard", "KeyChain", "PaperTowelRoll", "WineBottle", "HandTowel"},
        "Desk": _SURFACE_LIVING | {"BaseballBat", "BasketBall", "TeddyBear"},
        "DiningTable": _FOOD | _DISHES | _COOKWARE | _UTENSILS | _CONDIMENTS | _DECOR | _SMALL | _MEDIA
        | {"Candle", "PaperTowelRoll", "SoapBottle", "WineBottle"},
        "Drawer": _UTENSILS | _CONDIMENTS | _BATH | _SMALL | {"Book", "Newspaper", "RemoteControl", "HandTowel"},
        "Dresser": _SURFACE_LIVING | {"TeddyBear", "BasketBall"},
        "Fridge": _FOOD | _DISHES | {"Pan", "Pot", "WineBottle"},
        "GarbageCan": _FOOD | _BATH | {"CD", "CreditCard", "Newspaper", "PaperTowelRoll", "Pen", "Pencil",
                                       "WineBottle"},
        "HandTowelHolder": {"HandTowel"},
        "LaundryHamper": {"Cloth"},
        "Microwave": (_FOOD - {"Lettuce"}) | _DISHES,
        "Ottoman": _MEDIA | {"CellPhone", "CreditCard", "KeyChain", "Pillow", "Watch"},
        "Safe": _SMALL | _DECOR,
        "Shelf": _DISHES | _CONDIMENTS | _BATH | _DECOR | _SMALL | _MEDIA
        | {"AlarmClock", "Kettle", "WineBottle", "SoapBottle"},
        "SideTable": _SURFACE_LIVING | {"BaseballBat", "TeddyBear"},
        "SinkBasin": (_FOOD - {"Bread"}) | _DISHES | _COOKWARE | _UTENSILS | {"Cloth", "DishSponge", "SoapBar"},
        "Sofa": _MEDIA | {"CellPhone", "CreditCard", "KeyChain", "Pillow", "Watch"},
        "StoveBurner": _COOKWARE,
        "TVStand": _MEDIA | _DECOR | _SMALL | {"Bowl", "Plate"},
        "Toaster": set(),
        "Toilet": {"Candle", "Cloth", "DishSponge", "SoapBar", "SoapBottle", "SprayBottle", "ToiletPaper"},
        "ToiletPaperHanger": {"ToiletPaper"},
        "TowelHolder": {"Towel"},
    }.items()
}

OPENABLE: frozenset[str] = frozenset({"Cabinet", "Drawer", "Fridge", "Microwave", "Safe"})
LAMP_SURFACES: tuple[str, ...] = ("Desk", "SideTable", "Dresser")

OBJECT_TYPES: frozenset[str] = frozenset(
    {o for v in RECEPTACLE_TYPES.values() for o in v} | TOGGLEABLE
)

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

ROOM_OBJECTS: dict[str, frozenset[str]] = {
    "kitchen": frozenset(_FOOD | _DISHES | _COOKWARE | _UTENSILS | _CONDIMENTS | _DECOR
                         | {"CellPhone", "CreditCard", "DishSponge", "PaperTowelRoll", "SoapBottle", "WineBottle"}),
    "livingroom": frozenset(_MEDIA | _DECOR | _SMALL - {"Pen", "Pencil"}
                            | {"Bowl", "Pillow", "Plate", "TissueBox", "Candle", "WateringCan"}),
    "bedroom": frozenset(_SMALL | _MEDIA | _SPORTS | _DECOR - {"Vase"}
                         | {"AlarmClock", "Bowl", "Cloth", "Mug", "Pillow", "TeddyBear", "TissueBox"}),
    "bathroom": frozenset(_BATH | {"HandTowel", "PaperTowelRoll", "Towel"}),
}

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
