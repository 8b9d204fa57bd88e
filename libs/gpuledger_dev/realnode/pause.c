/* A pod sandbox's first process: it holds the pod's namespaces, reaps the orphans handed to it,
 * and ends cleanly on SIGINT or SIGTERM. Built statically by gpuledger_dev.realnode.images. */
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

static void leave(int sig) {
    (void)sig;
    _exit(0);
}

static void reap(int sig) {
    (void)sig;
    while (waitpid(-1, 0, WNOHANG) > 0) {
    }
}

int main(void) {
    struct sigaction on_stop = {0};
    struct sigaction on_child = {0};
    on_stop.sa_handler = leave;
    on_child.sa_handler = reap;
    on_child.sa_flags = SA_NOCLDSTOP | SA_RESTART;
    sigaction(SIGINT, &on_stop, 0);
    sigaction(SIGTERM, &on_stop, 0);
    sigaction(SIGCHLD, &on_child, 0);
    for (;;) {
        pause();
    }
}
