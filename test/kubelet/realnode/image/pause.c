// The node's sandbox image (scripts/real-node.sh): a pod's infrastructure process. It holds the
// pod's namespaces, reaps the children it inherits and exits 0 on SIGINT or SIGTERM. Built with
// gcc -static, so the image holds this one file.
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void Quit(int sig) {
  (void)sig;
  _exit(0);
}

static void Reap(int sig) {
  (void)sig;
  while (waitpid(-1, NULL, WNOHANG) > 0) {
  }
}

static void On(int sig, void (*handler)(int)) {
  struct sigaction action;
  memset(&action, 0, sizeof(action));
  action.sa_handler = handler;
  action.sa_flags = SA_RESTART;
  sigaction(sig, &action, NULL);
}

int main(void) {
  On(SIGINT, Quit);
  On(SIGTERM, Quit);
  On(SIGCHLD, Reap);
  for (;;) pause();
}
