# lendbox code-context driver: a Python interpreter that keeps its state between runs.
# lendboxd embeds this file and starts it in the sandbox as `python3 -u -c SOURCE` under a
# PTY-session holder (pipe mode); the standard library only.
#
# Protocol. Requests come on stdin, one JSON object a line: {"id": ID, "code": TEXT}. Answers go
# to the driver's original stdout (its fd 1 is pointed elsewhere while code runs), one JSON
# object a line: {"id": ID, "stdout", "stderr", "result", "error", "duration_ms"}; at start
# {"id": "ready", "python": VERSION}. A run's own output (sys.stdout, sys.stderr and anything
# written to fds 1 and 2, child processes included) is captured in memory files. SIGINT
# interrupts a run (KeyboardInterrupt) and is ignored between runs.
import ast
import json
import linecache
import os
import signal
import sys
import time
import traceback

OUT_MAX = 32768  # characters of stdout, stderr and result kept
TRACE_MAX = 16384  # characters of a traceback kept
VALUE_MAX = 4096  # characters of an error's value kept
LINE_MAX = 64 << 20  # bytes of one request line

running = False


def on_sigint(signum, frame):
    if running:
        raise KeyboardInterrupt


def cut(text, limit):
    if text is None:
        return None
    text = text.encode("utf-8", "replace").decode("utf-8")
    if len(text) > limit:
        return text[:limit] + "\n[... %d more characters not shown]" % (len(text) - limit)
    return text


def memory_file():
    try:
        return os.memfd_create("lendbox-context", 0)
    except (AttributeError, OSError):
        import tempfile

        fd, path = tempfile.mkstemp(prefix="lendbox-context-")
        os.unlink(path)
        return fd


def read_back(fd):
    size = os.fstat(fd).st_size
    os.lseek(fd, 0, os.SEEK_SET)
    chunks, want = [], min(size, OUT_MAX * 4 + 4)
    while want > 0:
        b = os.read(fd, want)
        if not b:
            break
        chunks.append(b)
        want -= len(b)
    os.close(fd)
    text = b"".join(chunks).decode("utf-8", "replace")
    if size > OUT_MAX * 4 + 4 and len(text) <= OUT_MAX:
        text += "\n[... %d more bytes not shown]" % (size - OUT_MAX * 4 - 4)
    return text


def user_traceback(e):
    tb = e.__traceback__
    while tb is not None and not tb.tb_frame.f_code.co_filename.startswith("<context-"):
        tb = tb.tb_next
    if tb is None:
        return "".join(traceback.format_exception_only(type(e), e))
    return "".join(traceback.format_exception(type(e), e, tb))


def execute(code, ns, name):
    # the run's source, for the tracebacks of this run and of functions it defines
    linecache.cache[name] = (len(code), None, code.splitlines(True), name)
    tree = ast.parse(code, name, "exec")
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    exec(compile(tree, name, "exec"), ns)
    if last is None:
        return None
    value = eval(compile(last, name, "eval"), ns)
    if value is None:
        return None
    ns["_"] = value
    return repr(value)


def write_all(fd, data):
    while data:
        n = os.write(fd, data)
        data = data[n:]


def main():
    global running
    answer_fd = os.dup(1)  # not inherited by the code's children
    request = os.fdopen(os.dup(0), "rb")
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    sys.stdin = open(os.devnull)
    signal.signal(signal.SIGINT, on_sigint)
    ns = {"__name__": "__main__", "__builtins__": __builtins__}
    runs = 0
    ready = {"id": "ready", "python": sys.version.split()[0]}
    write_all(answer_fd, (json.dumps(ready) + "\n").encode())
    while True:
        line = request.readline(LINE_MAX)
        if not line:
            return
        try:
            req = json.loads(line)
            rid, code = str(req["id"]), req["code"]
            if not isinstance(code, str):
                raise ValueError("code is not a string")
        except (ValueError, KeyError, TypeError):
            continue
        runs += 1
        out, err = memory_file(), memory_file()
        os.dup2(out, 1)
        os.dup2(err, 2)
        result = error = None
        start = time.monotonic()
        try:
            running = True
            try:
                result = execute(code, ns, "<context-%d>" % runs)
            finally:
                running = False
        except BaseException as e:  # SystemExit and KeyboardInterrupt too: the context lives on
            running = False
            try:
                error = {
                    "name": type(e).__name__,
                    "value": cut(str(e), VALUE_MAX),
                    "traceback": cut(user_traceback(e), TRACE_MAX),
                }
            except BaseException:
                error = {"name": type(e).__name__, "value": "", "traceback": ""}
        duration_ms = int((time.monotonic() - start) * 1000)
        for f in (sys.__stdout__, sys.__stderr__, sys.stdout, sys.stderr):
            try:
                f.flush()
            except BaseException:
                pass
        os.dup2(null, 1)
        os.dup2(null, 2)
        answer = {
            "id": rid,
            "stdout": cut(read_back(out), OUT_MAX),
            "stderr": cut(read_back(err), OUT_MAX),
            "result": cut(result, OUT_MAX),
            "error": error,
            "duration_ms": duration_ms,
        }
        write_all(answer_fd, (json.dumps(answer, ensure_ascii=False) + "\n").encode("utf-8"))


main()
