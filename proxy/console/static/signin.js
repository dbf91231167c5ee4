// The one-time sign-in link that `serve` prints when no admin token is set
// (proxy/console/first_signin.py): http://host:port/console/signin#token=...
// The token is in the fragment, which the browser never sends to any server and never puts in a
// Referer. Take it out of the address bar and of this history entry at once, then sign in with
// it as the form does (a POST, with the same Origin check).
const found = /^#token=([A-Za-z0-9_-]{16,200})$/.exec(location.hash);
if (location.hash) history.replaceState(null, "", location.pathname + location.search);
if (found) {
  const form = document.getElementById("signin");
  form.elements.token.value = found[1];
  form.elements.link.value = "1";
  form.submit();
}
