"""A tiny HTTP server for endpoint tests: submitted as ``kind: inference``, it answers GET with
its pid, the path, and who called it (the ``X-Gpupool-User`` and ``Authorization`` headers the
service forwards), and echoes a POSTed JSON body."""

SERVER = '''
import http.server, json, os

class Answer(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"pid": os.getpid(), "path": self.path,
                           "user": self.headers.get("X-Gpupool-User"),
                           "token": self.headers.get("Authorization")}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        data = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = json.dumps({"echo": json.loads(data)}).encode()
        self.send_response(201)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass

http.server.ThreadingHTTPServer(("127.0.0.1", int(os.environ["PORT"])), Answer).serve_forever()
'''
