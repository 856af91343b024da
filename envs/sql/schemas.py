"""Built-in database schemas: declarative table specs and a seeded data generator.

Six schemas, 4-6 tables each: ``hr``, ``library``, ``retail`` and ``university`` (train);
``flights`` and ``clinic`` (test). Every table has an integer ``id`` primary key and a unique
*label* column (a name or title); the other columns are categorical (``cat``), numeric
(``num``), or foreign keys (``fk``). The question templates in :mod:`.tasks` are generic over
these roles, so a new schema needs only a spec here.

Data is drawn from a ``random.Random`` seeded by (schema, seed): the same seed always gives the
same database, and no global RNG state is touched.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["SCHEMAS", "Col", "Schema", "Table", "build_rows", "create_sql"]

Gen = Callable[[random.Random], Any]


@dataclass(frozen=True)
class Col:
    """A column. ``role`` is ``label``, ``cat``, ``num`` or ``fk``; ``phrase`` is its English name."""

    name: str
    role: str
    phrase: str
    gen: Gen | None = None
    ref: str | None = None  # fk target table
    sqltype: str = "TEXT"
    null_rate: float = 0.0


@dataclass(frozen=True)
class Table:
    name: str
    singular: str
    plural: str
    rows: int
    cols: tuple[Col, ...]

    def by_role(self, role: str) -> list[Col]:
        return [c for c in self.cols if c.role == role]

    @property
    def label(self) -> Col:
        return self.by_role("label")[0]


@dataclass(frozen=True)
class Schema:
    name: str
    tables: tuple[Table, ...]
    description: str = ""
    label_pools: dict[str, Callable[[random.Random, int], list[str]]] = field(default_factory=dict)

    def table(self, name: str) -> Table:
        return next(t for t in self.tables if t.name == name)


# ---------------------------------------------------------------------------- value pools

FIRST = ["Ada", "Alan", "Beatriz", "Carlos", "Chen", "Dana", "Elif", "Emma", "Farah", "Felix", "Grace", "Hana", "Hugo", "Ines", "Ivan", "Jonas", "Julia", "Kofi", "Lara", "Leo", "Maya", "Mateo", "Nadia", "Noah", "Olga", "Omar", "Priya", "Quinn", "Rosa", "Sami", "Sofia", "Tariq", "Uma", "Victor", "Wen", "Yara", "Zane", "Aiko", "Bruno", "Clara", "Diego", "Eva", "Femi", "Goran", "Helga", "Idris", "Jana", "Kai", "Lina", "Marco", "Nia", "Oscar", "Pia", "Raj", "Sven", "Tia"]
LAST = ["Abe", "Baker", "Costa", "Diaz", "Evans", "Fischer", "Garcia", "Haddad", "Ito", "Jensen", "Khan", "Larsen", "Moreau", "Nakamura", "Okafor", "Petrov", "Quispe", "Rossi", "Silva", "Tanaka", "Usman", "Varga", "Weber", "Xu", "Yilmaz", "Zhou", "Bauer", "Chopra", "Dubois", "Eriksen", "Ferrari", "Gomez", "Horvat", "Iqbal", "Kowalski", "Lindqvist", "Mensah", "Novak", "Ortiz", "Park"]
CITIES = ["Lisbon", "Oslo", "Austin", "Nairobi", "Osaka", "Lyon", "Denver", "Porto", "Krakow", "Seoul", "Quito", "Perth", "Leeds", "Bergen", "Tampa", "Accra", "Turin", "Malmo"]
COUNTRIES = ["Portugal", "Norway", "USA", "Kenya", "Japan", "France", "Brazil", "Canada", "India", "Germany", "Chile", "Egypt"]
ADJ = ["Silent", "Golden", "Hidden", "Broken", "Northern", "Crimson", "Quiet", "Endless", "Distant", "Bright", "Hollow", "Wild", "Iron", "Paper", "Glass", "Last", "Lost", "Second", "Winter", "Summer"]
NOUN = ["River", "Garden", "Kingdom", "Machine", "Ocean", "Letter", "Forest", "Mirror", "Harbor", "Engine", "Voyage", "Archive", "Signal", "Orchard", "Lantern", "Bridge", "Compass", "Island", "Station", "Theory"]


def _people(rng: random.Random, n: int) -> list[str]:
    pool = [f"{f} {la}" for f in FIRST for la in LAST]
    return rng.sample(pool, n)


def _titles(rng: random.Random, n: int) -> list[str]:
    pool = [f"The {a} {b}" for a in ADJ for b in NOUN]
    return rng.sample(pool, n)


def _combo(prefixes: list[str], suffixes: list[str]) -> Callable[[random.Random, int], list[str]]:
    def make(rng: random.Random, n: int) -> list[str]:
        pool = [f"{p} {s}" for p in prefixes for s in suffixes]
        return rng.sample(pool, n)

    return make


def _fixed(names: list[str]) -> Callable[[random.Random, int], list[str]]:
    def make(rng: random.Random, n: int) -> list[str]:
        if n > len(names):
            raise ValueError("pool too small")
        return rng.sample(names, n)

    return make


def choice(*values: str) -> Gen:
    return lambda r: r.choice(values)


def weighted(values: list[str], weights: list[float]) -> Gen:
    return lambda r: r.choices(values, weights)[0]


def integer(lo: int, hi: int, step: int = 1) -> Gen:
    return lambda r: r.randrange(lo, hi + 1, step)


def money(lo: float, hi: float) -> Gen:
    return lambda r: round(r.uniform(lo, hi), 2)


def label(phrase: str = "name", name: str = "name") -> Col:
    return Col(name, "label", phrase)


def cat(name: str, phrase: str, gen: Gen, null_rate: float = 0.0) -> Col:
    return Col(name, "cat", phrase, gen, null_rate=null_rate)


def num(name: str, phrase: str, gen: Gen, sqltype: str = "INTEGER", null_rate: float = 0.0) -> Col:
    return Col(name, "num", phrase, gen, sqltype=sqltype, null_rate=null_rate)


def fk(name: str, ref: str, phrase: str, null_rate: float = 0.0) -> Col:
    return Col(name, "fk", phrase, ref=ref, sqltype="INTEGER", null_rate=null_rate)


# ---------------------------------------------------------------------------- schemas

HR = Schema("hr", (
    Table("departments", "department", "departments", 12, (
        label(), cat("city", "city", choice(*CITIES[:6])), num("budget", "budget", money(1e5, 2e6), "REAL"))),
    Table("jobs", "job", "jobs", 15, (
        label("title", "title"), cat("job_level", "level", choice("junior", "mid", "senior", "lead")),
        num("min_salary", "minimum salary", integer(30000, 90000, 500)))),
    Table("employees", "employee", "employees", 160, (
        label(), fk("department_id", "departments", "department"), fk("job_id", "jobs", "job"),
        num("salary", "salary", money(32000, 185000), "REAL"), num("hire_year", "hire year", integer(2001, 2024)),
        cat("gender", "gender", choice("female", "male", "nonbinary")),
        cat("office", "office", choice("remote", "hq", "branch"), null_rate=0.05))),
    Table("projects", "project", "projects", 25, (
        label(), fk("department_id", "departments", "department", null_rate=0.1),
        num("budget", "budget", money(5000, 400000), "REAL"),
        cat("status", "status", choice("planned", "active", "done", "cancelled")))),
    Table("assignments", "assignment", "assignments", 220, (
        label("code", "code"), fk("employee_id", "employees", "employee"), fk("project_id", "projects", "project"),
        num("hours", "hours", integer(5, 400)), cat("role", "role", choice("owner", "contributor", "reviewer")))),
), "A company's departments, jobs, employees and projects.", {
    "departments": _fixed(["Sales", "Engineering", "Finance", "Legal", "Marketing", "Support", "Research",
                           "Operations", "Design", "Security", "Procurement", "Logistics", "Training"]),
    "jobs": _combo(["Data", "Software", "Sales", "Support", "Finance", "Legal"], ["Analyst", "Engineer", "Manager",
                                                                                  "Associate"]),
    "employees": _people,
    "projects": _combo(ADJ, ["Falcon", "Atlas", "Nova"]),
    "assignments": lambda r, n: [f"A-{1000 + i}" for i in range(n)],
})

LIBRARY = Schema("library", (
    Table("branches", "branch", "branches", 8, (
        label(), cat("city", "city", choice(*CITIES[6:12])), num("opened_year", "opening year", integer(1950, 2020)))),
    Table("authors", "author", "authors", 60, (
        label(), cat("country", "country", choice(*COUNTRIES)), num("birth_year", "birth year", integer(1900, 1995)))),
    Table("books", "book", "books", 240, (
        label("title", "title"), fk("author_id", "authors", "author"),
        cat("genre", "genre", choice("fantasy", "history", "poetry", "science", "crime", "travel")),
        num("year", "publication year", integer(1950, 2024)), num("pages", "page count", integer(80, 900)),
        num("price", "price", money(4, 60), "REAL"))),
    Table("members", "member", "members", 150, (
        label(), cat("city", "city", choice(*CITIES[6:12])),
        cat("membership", "membership type", weighted(["basic", "student", "premium"], [5, 3, 2])),
        num("join_year", "year joined", integer(2005, 2024)))),
    Table("loans", "loan", "loans", 400, (
        label("reference", "reference"), fk("book_id", "books", "book"), fk("member_id", "members", "member"),
        fk("branch_id", "branches", "branch"), num("days", "loan length in days", integer(1, 60)),
        num("fine", "fine", money(0, 25), "REAL"))),
), "A public library network: branches, authors, books, members and loans.", {
    "branches": _combo(["Central", "North", "South", "East", "West", "Harbor", "Hill", "Park"], ["Library"]),
    "authors": _people,
    "books": _titles,
    "members": _people,
    "loans": lambda r, n: [f"L{20000 + i}" for i in range(n)],
})

RETAIL = Schema("retail", (
    Table("stores", "store", "stores", 10, (
        label(), cat("city", "city", choice(*CITIES[:8])), num("size_sqm", "floor area in square metres",
                                                               integer(150, 5000, 10)))),
    Table("categories", "category", "categories", 9, (
        label(), cat("department", "department", choice("home", "food", "leisure")))),
    Table("products", "product", "products", 120, (
        label(), fk("category_id", "categories", "category"), cat("brand", "brand",
                                                                  choice("Acme", "Nordik", "Vela", "Orbis", "Kumo")),
        num("price", "price", money(1, 900), "REAL"), num("stock", "units in stock", integer(0, 500)))),
    Table("customers", "customer", "customers", 180, (
        label(), cat("city", "city", choice(*CITIES[:8])),
        cat("segment", "segment", choice("consumer", "business", "student")), num("age", "age", integer(18, 85)))),
    Table("orders", "order", "orders", 450, (
        label("order number", "order_number"), fk("customer_id", "customers", "customer"),
        fk("store_id", "stores", "store"), fk("product_id", "products", "product"),
        num("quantity", "quantity", integer(1, 12)), num("amount", "amount", money(2, 3000), "REAL"),
        num("year", "year", integer(2018, 2024)), cat("channel", "channel", choice("online", "in-store", "phone")))),
), "A retail chain: stores, product categories, products, customers and orders.", {
    "stores": _combo(["Mega", "City", "Corner", "Outlet", "Metro"], ["Market", "Store"]),
    "categories": _fixed(["Kitchen", "Garden", "Toys", "Snacks", "Drinks", "Sports", "Books", "Lighting", "Bedding",
                          "Tools"]),
    "products": _combo(["Smart", "Classic", "Eco", "Pro", "Mini", "Ultra", "Family", "Travel", "Deluxe", "Basic",
                        "Super", "Compact"], ["Lamp", "Kettle", "Chair", "Blender", "Tent", "Ball", "Juice",
                                              "Crackers", "Pillow", "Drill", "Mug", "Puzzle"]),
    "customers": _people,
    "orders": lambda r, n: [f"ORD-{5000 + i}" for i in range(n)],
})

UNIVERSITY = Schema("university", (
    Table("faculties", "faculty", "faculties", 7, (
        label(), cat("campus", "campus", choice("north", "south", "city")),
        num("founded", "founding year", integer(1850, 1990)))),
    Table("instructors", "instructor", "instructors", 50, (
        label(), fk("faculty_id", "faculties", "faculty"),
        cat("rank", "academic rank", choice("lecturer", "assistant professor", "associate professor", "professor")),
        num("salary", "salary", integer(40000, 160000, 250)))),
    Table("courses", "course", "courses", 70, (
        label("title", "title"), fk("instructor_id", "instructors", "instructor", null_rate=0.05),
        num("credits", "credit count", integer(1, 8)), cat("level", "level", choice("intro", "intermediate", "advanced")))),
    Table("students", "student", "students", 200, (
        label(), fk("faculty_id", "faculties", "faculty"), num("enrol_year", "enrolment year", integer(2015, 2024)),
        num("gpa", "GPA", money(1.5, 4.0), "REAL"), cat("status", "status", choice("full-time", "part-time")))),
    Table("enrollments", "enrollment", "enrollments", 500, (
        label("code", "code"), fk("student_id", "students", "student"), fk("course_id", "courses", "course"),
        num("score", "score", integer(0, 100)), cat("term", "term", choice("spring", "summer", "autumn")))),
), "A university: faculties, instructors, courses, students and enrollments.", {
    "faculties": _fixed(["Science", "Arts", "Law", "Medicine", "Engineering", "Business", "Education", "Music"]),
    "instructors": _people,
    "courses": _combo(["Intro to", "Advanced", "Applied", "Topics in", "Seminar in", "History of", "Methods in"],
                      ["Algebra", "Ethics", "Genetics", "Economics", "Optics", "Poetry", "Statistics", "Robotics",
                       "Botany", "Law", "Design", "Networks"]),
    "students": _people,
    "enrollments": lambda r, n: [f"E{30000 + i}" for i in range(n)],
})

FLIGHTS = Schema("flights", (
    Table("airlines", "airline", "airlines", 10, (
        label(), cat("country", "country", choice(*COUNTRIES[:7])), num("fleet_size", "fleet size",
                                                                         integer(5, 400)))),
    Table("airports", "airport", "airports", 18, (
        label("code", "code"), cat("city", "city", choice(*CITIES)),
        num("elevation_m", "elevation in metres", integer(0, 2800)), cat("hub_size", "hub size",
                                                                           choice("small", "medium", "large")))),
    Table("flights", "flight", "flights", 300, (
        label("flight number", "flight_number"), fk("airline_id", "airlines", "airline"),
        fk("origin_id", "airports", "origin airport"), fk("destination_id", "airports", "destination airport"),
        num("distance_km", "distance in km", integer(200, 12000)), num("duration_min", "duration in minutes",
                                                                       integer(40, 900)),
        cat("aircraft", "aircraft type", choice("A320", "A350", "B737", "B787", "E190")))),
    Table("passengers", "passenger", "passengers", 220, (
        label(), cat("nationality", "nationality", choice(*COUNTRIES)), num("age", "age", integer(1, 90)),
        cat("loyalty_tier", "loyalty tier", choice("none", "silver", "gold", "platinum")))),
    Table("bookings", "booking", "bookings", 600, (
        label("reference", "reference"), fk("passenger_id", "passengers", "passenger"),
        fk("flight_id", "flights", "flight"), cat("seat_class", "seat class", choice("economy", "premium", "business")),
        num("fare", "fare", money(40, 4500), "REAL"))),
), "Airlines, airports, flights, passengers and bookings.", {
    "airlines": _combo(["Aero", "Sky", "Blue", "Polar", "Sun", "Star"], ["Air", "Wings", "Jet"]),
    "airports": lambda r, n: r.sample(["LIS", "OSL", "AUS", "NBO", "KIX", "LYS", "DEN", "OPO", "KRK", "ICN", "UIO",
                                       "PER", "LBA", "BGO", "TPA", "ACC", "TRN", "MMX", "GRU", "YVR"], n),
    "flights": lambda r, n: [f"{r.choice('AKSVX')}{r.choice('BJQZ')}{100 + i}" for i in range(n)],
    "passengers": _people,
    "bookings": lambda r, n: [f"BK{70000 + i}" for i in range(n)],
})

CLINIC = Schema("clinic", (
    Table("doctors", "doctor", "doctors", 30, (
        label(), cat("specialty", "specialty", choice("cardiology", "dermatology", "pediatrics", "neurology",
                                                      "oncology", "general practice")),
        num("experience_years", "years of experience", integer(1, 40)))),
    Table("patients", "patient", "patients", 250, (
        label(), cat("city", "city", choice(*CITIES[8:16])), num("age", "age", integer(0, 99)),
        cat("insurance", "insurance plan", choice("public", "private", "none"), null_rate=0.04))),
    Table("appointments", "appointment", "appointments", 600, (
        label("reference", "reference"), fk("patient_id", "patients", "patient"), fk("doctor_id", "doctors", "doctor"),
        num("year", "year", integer(2019, 2024)), num("cost", "cost", money(20, 900), "REAL"),
        cat("status", "status", choice("completed", "cancelled", "no-show")))),
    Table("medications", "medication", "medications", 40, (
        label(), cat("manufacturer", "manufacturer", choice("Medix", "Curelab", "Helion", "Biora")),
        num("unit_price", "unit price", money(0.5, 300), "REAL"))),
    Table("prescriptions", "prescription", "prescriptions", 500, (
        label("code", "code"), fk("appointment_id", "appointments", "appointment"),
        fk("medication_id", "medications", "medication"), num("quantity", "quantity", integer(1, 90)),
        num("refills", "number of refills", integer(0, 5)))),
), "A clinic: doctors, patients, appointments, medications and prescriptions.", {
    "doctors": _people,
    "patients": _people,
    "appointments": lambda r, n: [f"AP{40000 + i}" for i in range(n)],
    "medications": _combo(["Cardo", "Derma", "Neuro", "Pedi", "Onco", "Gena", "Flexi", "Calmo", "Vita", "Resp"],
                          ["zol", "pril", "mab", "cin"]),
    "prescriptions": lambda r, n: [f"RX{90000 + i}" for i in range(n)],
})

SCHEMAS: dict[str, Schema] = {s.name: s for s in (HR, LIBRARY, RETAIL, UNIVERSITY, FLIGHTS, CLINIC)}


def _sql_type(c: Col) -> str:
    return "TEXT" if c.role in ("label", "cat") else c.sqltype


def create_sql(schema: Schema) -> str:
    """``CREATE TABLE`` statements for a schema (foreign keys declared)."""
    out = []
    for t in schema.tables:
        cols = ["id INTEGER PRIMARY KEY"]
        cols += [f"{c.name} {_sql_type(c)}" + (" NOT NULL UNIQUE" if c.role == "label" else "") for c in t.cols]
        cols += [f"FOREIGN KEY ({c.name}) REFERENCES {c.ref}(id)" for c in t.cols if c.role == "fk"]
        out.append(f"CREATE TABLE {t.name} (\n  " + ",\n  ".join(cols) + "\n);")
    return "\n".join(out)


def build_rows(schema: Schema, seed: int) -> dict[str, list[tuple[Any, ...]]]:
    """Seeded rows for every table (``id`` first, then the columns in spec order).

    Foreign keys point at a skewed subset of parents, so some parents have no children (which
    ``NOT IN`` questions need) and group sizes differ (which ``HAVING`` questions need).
    """
    rng = random.Random(f"{schema.name}:{seed}")
    sizes = {t.name: t.rows for t in schema.tables}
    out: dict[str, list[tuple[Any, ...]]] = {}
    for t in schema.tables:
        labels = schema.label_pools[t.name](rng, t.rows)
        fk_pools: dict[str, tuple[list[int], list[float]]] = {}
        for c in t.by_role("fk"):
            n = sizes[c.ref or ""]
            ids = list(range(1, n + 1))
            keep = ids if n <= 3 else rng.sample(ids, max(2, int(n * 0.8)))
            weights = [rng.uniform(0.2, 3.0) for _ in keep]
            fk_pools[c.name] = (keep, weights)
        rows: list[tuple[Any, ...]] = []
        for i in range(t.rows):
            row: list[Any] = [i + 1]
            for c in t.cols:
                if c.role == "label":
                    v: Any = labels[i]
                elif c.role == "fk":
                    keep, weights = fk_pools[c.name]
                    v = rng.choices(keep, weights)[0]
                else:
                    assert c.gen is not None
                    v = c.gen(rng)
                if c.null_rate and rng.random() < c.null_rate:
                    v = None
                row.append(v)
            rows.append(tuple(row))
        out[t.name] = rows
    return out
