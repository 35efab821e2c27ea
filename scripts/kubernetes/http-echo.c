/* A stand-in for hashicorp/http-echo in the one-node cluster (no registry
 * is reachable): `-listen=:PORT -text=TEXT` answers every HTTP request with
 * TEXT and a newline, and exits on SIGTERM as the original does (as PID 1
 * a signal without a handler is ignored, and the pod would wait out its
 * whole grace period). Built static by images.sh. */
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static void on_term(int sig) {
    (void)sig;
    _exit(0);
}

int main(int argc, char **argv) {
    int port = 5678;
    const char *text = "hello-world";
    for (int i = 1; i < argc; i++) {
        if (strncmp(argv[i], "-listen=", 8) == 0) {
            const char *colon = strrchr(argv[i], ':');
            port = atoi(colon ? colon + 1 : argv[i] + 8);
        } else if (strncmp(argv[i], "-text=", 6) == 0) {
            text = argv[i] + 6;
        }
    }
    signal(SIGPIPE, SIG_IGN);
    signal(SIGTERM, on_term);
    signal(SIGINT, on_term);
    int s = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons(port)};
    if (bind(s, (struct sockaddr *)&addr, sizeof addr) != 0 || listen(s, 64) != 0) {
        perror("http-echo: listen");
        return 1;
    }
    char body[4096];
    int n = snprintf(body, sizeof body, "%s\n", text);
    char reply[8192];
    int len = snprintf(reply, sizeof reply,
                       "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n"
                       "Connection: close\r\n\r\n%s",
                       n, body);
    for (;;) {
        int c = accept(s, NULL, NULL);
        if (c < 0) continue;
        char buf[4096];
        (void)read(c, buf, sizeof buf);
        (void)write(c, reply, len);
        close(c);
    }
}
