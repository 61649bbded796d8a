/** Where the panel keeps its conversation between page loads: the session id and token in localStorage. */
import type { Session } from "./reducer";

const KEY = "textbook-chat:session";

export function loadSession(storage: Storage | null = safeStorage()): Session | null {
  try {
    const raw = storage?.getItem(KEY);
    if (!raw) return null;
    const value = JSON.parse(raw) as Partial<Session>;
    return typeof value.id === "string" && typeof value.token === "string" ? { id: value.id, token: value.token } : null;
  } catch {
    return null;
  }
}

export function saveSession(session: Session | null, storage: Storage | null = safeStorage()): void {
  try {
    if (session) storage?.setItem(KEY, JSON.stringify(session));
    else storage?.removeItem(KEY);
  } catch {
    // storage full or blocked (private mode): the conversation just won't survive a reload
  }
}

function safeStorage(): Storage | null {
  try {
    return typeof localStorage === "undefined" ? null : localStorage;
  } catch {
    return null;
  }
}
