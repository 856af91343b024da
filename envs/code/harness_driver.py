"""Code-v0's hidden-test driver. Runs *inside* the sandbox as the run's program (stdlib only; it is
read as text by :mod:`.tasks`, never imported by the host).

The submitted code never runs in this process. The driver reads a nonce and the tests from its
stdin, makes itself non-dumpable (so a process of the same uid cannot read its memory or reach
its file descriptors), then starts the submission in a *fresh* interpreter whose only link to the
driver is a pipe of plain data: the tests run here and call the submission's functions through
proxies. Arguments and results cross as plain values (None, bool, int, float, complex, str,
bytes, and lists, tuples, dicts and sets of them); anything else stays in the submission's process
and is seen here as an opaque handle that can be called, indexed, iterated or asked for attributes,
but never compared. So a submission cannot reach the driver's reporting channel, read the tests,
or pass a test with an object that claims to equal anything: every comparison a test makes is
between plain values, in this process. Results go to the run's stdout, tagged with the nonce.
"""

import builtins
import json
import marshal
import os
import sys

MAX_DEPTH = 100

# --------------------------------------------------------------------------- the submission side
# Runs in the fresh interpreter (``-I -S``, no imports beyond builtins, so it starts fast): loads the
# submission as __main__ and serves requests on the pipe fds RFD / WFD (set by a prefix line).
# Requests come as marshal (from the trusted driver); answers go back as JSON lines whose only
# strings are hex digits and tags, built by hand (the driver parses them with json).
SOLUTION_SIDE = r'''
import builtins, marshal, os, sys
MAX_DEPTH = 100
handles = {}

def read_exact(n):
    buf = b""
    while len(buf) < n:
        chunk = os.read(RFD, n - len(buf))
        if not chunk:
            os._exit(0)
        buf += chunk
    return buf

def recv():
    return marshal.loads(read_exact(int.from_bytes(read_exact(4), "big")))

def send(text):
    data = (text + "\n").encode()
    while data:
        data = data[os.write(WFD, data):]

def q(s):
    return '"' + s + '"'

def hx(s):
    return q(s.encode("utf-8", "surrogatepass").hex())

def handle(v):
    handles[id(v)] = v
    return '["h",%d]' % id(v)

PLAIN = {list: "l", tuple: "t", set: "S", frozenset: "F"}

def enc(v, depth=0):
    t = type(v)
    if depth > MAX_DEPTH:
        return handle(v)
    if v is None:
        return '["n"]'
    if t is bool:
        return '["b",%s]' % ("true" if v else "false")
    if t is int:
        return '["i",%s]' % q(format(v, "x"))
    if t is float:
        return '["f",%s]' % q(v.hex())
    if t is complex:
        return '["c",%s,%s]' % (q(v.real.hex()), q(v.imag.hex()))
    if t is str:
        return '["s",%s]' % hx(v)
    if t is bytes:
        return '["y",%s]' % q(v.hex())
    if t in PLAIN:
        return '["%s",[%s]]' % (PLAIN[t], ",".join(enc(x, depth + 1) for x in v))
    if t is dict:
        return '["d",[%s]]' % ",".join("[%s,%s]" % (enc(k, depth + 1), enc(x, depth + 1)) for k, x in v.items())
    # a subclass of a plain type, or an array with tolist(): its plain value (as if returned plainly)
    for base, conv in ((bool, bool), (int, int), (float, float), (complex, complex), (str, str.__str__),
                       (bytes, bytes), (list, list), (tuple, tuple), (dict, dict), (frozenset, frozenset),
                       (set, set)):
        if isinstance(v, base):
            return enc(conv(v), depth + 1)
    tolist = getattr(t, "tolist", None)
    if callable(tolist) and t.__module__.split(".")[0] == "numpy":
        return enc(v.tolist(), depth + 1)
    return handle(v)

def dec(x):
    tag = x[0]
    if tag == "n": return None
    if tag == "b": return bool(x[1])
    if tag == "i": return int(x[1], 16)
    if tag == "f": return float.fromhex(x[1])
    if tag == "c": return complex(float.fromhex(x[1]), float.fromhex(x[2]))
    if tag == "s": return x[1]
    if tag == "y": return x[1]
    if tag == "l": return [dec(i) for i in x[1]]
    if tag == "t": return tuple(dec(i) for i in x[1])
    if tag == "S": return set(dec(i) for i in x[1])
    if tag == "F": return frozenset(dec(i) for i in x[1])
    if tag == "d": return {dec(k): dec(v) for k, v in x[1]}
    if tag == "h": return handles[x[1]]
    raise ValueError(tag)

def exc(e):
    return '{"exc":[%s,%s]}' % (hx(type(e).__name__), hx(str(e)[:2000]))

mod = type(sys)("__main__")
mod.__dict__.update({"__builtins__": builtins, "__file__": "solution.py"})
sys.modules["__main__"] = mod
sys.argv = ["solution.py"]
try:
    exec(compile(recv(), "solution.py", "exec"), mod.__dict__)
    names = []
    for name, v in list(mod.__dict__.items()):
        if not name.startswith("__"):
            desc = '["m",%s]' % hx(v.__name__) if type(v) is type(sys) else enc(v)
            names.append("[%s,%s]" % (hx(name), desc))
    send('{"names":[%s]}' % ",".join(names))
except BaseException as e:
    send('{"error":%s}' % hx("%s: %s" % (type(e).__name__, e)))
    os._exit(0)
while True:
    req = recv()
    try:
        obj = dec(req["h"])
        op = req["op"]
        args = [dec(a) for a in req.get("args", [])]
        if op == "call":
            res = obj(*args, **{k: dec(v) for k, v in req.get("kwargs", {}).items()})
            after = ",".join(enc(a) if type(a) in (list, dict, set) else "null" for a in args)
            send('{"ok":%s,"after":[%s]}' % (enc(res), after))
            continue
        if op == "getattr":
            res = getattr(obj, args[0])
        elif op == "len":
            res = len(obj)
        elif op == "list":
            res = list(obj)
        elif op == "bool":
            res = bool(obj)
        elif op == "getitem":
            res = obj[args[0]]
        elif op == "contains":
            res = args[0] in obj
        elif op == "str":
            res = str(obj)
        elif op == "repr":
            res = repr(obj)
        elif op == "int":
            res = int(obj)
        elif op == "float":
            res = float(obj)
        else:
            raise ValueError("unknown op %r" % op)
        send('{"ok":%s}' % enc(res))
    except BaseException as e:
        if isinstance(e, SystemExit):
            os._exit(0)
        send(exc(e))
'''


class SolutionGone(Exception):
    """The submission's process died, exited or broke the protocol."""


class SolutionError(Exception):
    """The submission raised an exception that is not a built-in one."""


class Handle:
    """An object that lives in the submission's process. Usable, never comparable."""

    __slots__ = ("_id",)

    def __init__(self, hid):
        object.__setattr__(self, "_id", hid)

    def __call__(self, *args, **kwargs):
        return _solution().call(self, args, kwargs)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _solution().op(self, "getattr", name)

    def __len__(self):
        return _solution().op(self, "len")

    def __iter__(self):
        return iter(_solution().op(self, "list"))

    def __bool__(self):
        return _solution().op(self, "bool")

    def __getitem__(self, key):
        return _solution().op(self, "getitem", key)

    def __contains__(self, item):
        return _solution().op(self, "contains", item)

    def __str__(self):
        return _solution().op(self, "str")

    def __repr__(self):
        return _solution().op(self, "repr")

    def __int__(self):
        return _solution().op(self, "int")

    def __float__(self):
        return _solution().op(self, "float")

    def _refuse(self, *_args):
        raise TypeError("the submission returned an object that is not a plain value; tests compare plain "
                        "values only (return numbers, strings, lists, tuples, dicts or sets)")

    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __hash__ = _refuse


_TAGS: "dict[type, str]" = {list: "l", tuple: "t", set: "S", frozenset: "F"}


def enc(v, depth=0):
    t = type(v)
    if isinstance(v, Handle):
        return ["h", object.__getattribute__(v, "_id")]
    if depth > MAX_DEPTH:
        raise TypeError("argument nested too deeply")
    if t is type(None):
        return ["n"]
    if t is bool:
        return ["b", v]
    if t is int:
        return ["i", format(v, "x")]
    if t is float:
        return ["f", v.hex()]
    if t is complex:
        return ["c", v.real.hex(), v.imag.hex()]
    if t is str:
        return ["s", v]  # marshal carries str and bytes as they are
    if t is bytes:
        return ["y", v]
    if t in _TAGS:
        return [_TAGS[t], [enc(x, depth + 1) for x in v]]
    if t is dict:
        return ["d", [[enc(k, depth + 1), enc(x, depth + 1)] for k, x in v.items()]]
    raise TypeError("cannot pass a %s to the submission (only plain values cross)" % t.__name__)


def _unhex(h):
    return bytes.fromhex(str(h)).decode("utf-8", "surrogatepass")


def dec(x, depth=0):
    if depth > MAX_DEPTH + 5 or not isinstance(x, list) or not x:
        raise SolutionGone("malformed value")
    tag = x[0]
    if tag == "n":
        return None
    if tag == "b":
        return x[1] is True
    if tag == "i":
        return int(str(x[1]), 16)
    if tag == "f":
        return float.fromhex(str(x[1]))
    if tag == "c":
        return complex(float.fromhex(str(x[1])), float.fromhex(str(x[2])))
    if tag == "s":
        return _unhex(x[1])
    if tag == "y":
        return bytes.fromhex(str(x[1]))
    if tag in ("l", "t", "S", "F"):
        items = [dec(i, depth + 1) for i in x[1]]
        return {"l": list, "t": tuple, "S": set, "F": frozenset}[tag](items)
    if tag == "d":
        return {dec(k, depth + 1): dec(v, depth + 1) for k, v in x[1]}
    if tag == "h" and type(x[1]) is int:
        return Handle(x[1])
    raise SolutionGone("malformed value")


class Solution:
    """The submission's process (a fresh ``python -I -S``) and the pipes to it."""

    def __init__(self, source):
        to_r, self._to_w = os.pipe()
        self._from_r, from_w = os.pipe()
        code = "RFD, WFD = %d, %d\n" % (to_r, from_w) + SOLUTION_SIDE
        self.pid = os.fork()
        if self.pid == 0:
            try:
                os.set_inheritable(to_r, True)
                os.set_inheritable(from_w, True)
                null = os.open(os.devnull, os.O_RDWR)
                for fd in (0, 1, 2):
                    os.dup2(null, fd)
                os.execv(sys.executable, [sys.executable, "-I", "-S", "-c", code])
            finally:
                os._exit(127)
        os.close(to_r)
        os.close(from_w)
        self._rf = os.fdopen(self._from_r, "rb", buffering=1 << 16)
        self.dead = False
        self._send(source)
        first = self._recv()
        err = first.get("error")
        self.error = _unhex(err) if err is not None else None
        self.names = {}
        for item in first.get("names", []):
            if isinstance(item, list) and len(item) == 2:
                self.names[_unhex(item[0])] = item[1]

    def _send(self, obj):
        data = marshal.dumps(obj)
        data = len(data).to_bytes(4, "big") + data
        try:
            while data:
                data = data[os.write(self._to_w, data):]
        except OSError:
            self.dead = True
            raise SolutionGone("the submission's process is gone") from None

    def _recv(self):
        if self.dead:
            raise SolutionGone("the submission's process is gone")
        try:
            line = self._rf.readline()
            if not line:
                raise ValueError("end of stream")
            obj = json.loads(line)
            if not isinstance(obj, dict):
                raise ValueError("not an object")
            return obj
        except (ValueError, OSError, RecursionError, MemoryError):
            self.dead = True
            raise SolutionGone("the submission's process exited or broke the protocol") from None

    def _answer(self):
        resp = self._recv()
        if "exc" in resp:
            try:
                name, msg = (_unhex(x) for x in list(resp["exc"])[:2])
            except (ValueError, TypeError):
                name, msg = "Exception", ""
            cls = getattr(builtins, name, None)
            if (isinstance(cls, type) and issubclass(cls, Exception) and not issubclass(cls, SolutionGone)
                    and cls.__module__ == "builtins"):
                raise cls(msg)
            raise SolutionError("%s: %s" % (name, msg))
        if "ok" not in resp:
            self.dead = True
            raise SolutionGone("malformed answer")
        return resp

    def call(self, h, args, kwargs):
        self._send({"op": "call", "h": enc(h), "args": [enc(a) for a in args],
                    "kwargs": {str(k): enc(v) for k, v in kwargs.items()}})
        resp = self._answer()
        after = resp.get("after")
        if isinstance(after, list) and len(after) == len(args):
            for a, new in zip(args, after):  # noqa: B905 (runs on older interpreters too)
                if new is None:
                    continue
                val = dec(new)
                # in-place changes to list/dict/set arguments come back
                if type(a) is list and type(val) is list:
                    a[:] = val
                elif (type(a) is dict and type(val) is dict) or (type(a) is set and type(val) is set):
                    a.clear()
                    a.update(val)
        return dec(resp["ok"])

    def op(self, h, op, *args):
        self._send({"op": op, "h": enc(h), "args": [enc(a) for a in args]})
        return dec(self._answer()["ok"])

    def close(self):
        try:
            os.kill(self.pid, 9)
            os.waitpid(self.pid, 0)
        except OSError:
            pass


SOLUTION = None


def _solution():
    if SOLUTION is None:
        raise SolutionGone("no submission is loaded")
    return SOLUTION


def main():
    global SOLUTION
    workdir = os.getcwd()
    sys.path[:] = [p for p in sys.path if p not in ("", ".", workdir) and not p.startswith(workdir + os.sep)]
    try:
        import ctypes

        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 0
    except Exception:
        pass
    nonce = sys.stdin.readline().strip()
    spec = json.loads(sys.stdin.read())
    out_fd = os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)  # what tests print never mixes with the results

    def report(tag, ok):
        os.write(out_fd, ("\n@@AG %s %s %d\n" % (nonce, tag, ok)).encode())

    SOLUTION = Solution(spec["solution"])
    if SOLUTION.error:
        sys.stderr.write("your code failed to load: %s\n" % SOLUTION.error)
        report("done", 1)
        return
    ns = {"__name__": "__main__", "__builtins__": builtins}
    for name, desc in SOLUTION.names.items():
        try:
            if desc[0] == "m":
                mod = _unhex(desc[1])
                if mod in getattr(sys, "stdlib_module_names", ()) or mod in sys.builtin_module_names:
                    ns[name] = __import__(mod, fromlist=["_"])
            else:
                ns[name] = dec(desc)
        except Exception:
            continue
    if spec.get("setup", "").strip():
        exec(compile(spec["setup"], "setup.py", "exec"), ns)
    index = 0
    for test, counted in zip(spec["tests"], spec["counted"]):  # noqa: B905 (runs on older interpreters too)
        code = compile(test, "test.py", "exec")
        if not counted:
            exec(code, ns)
            continue
        try:
            exec(code, ns)
            report(index, 1)
        except Exception:
            report(index, 0)
        index += 1
    report("done", 1)
    SOLUTION.close()


if __name__ == "__main__":
    main()
