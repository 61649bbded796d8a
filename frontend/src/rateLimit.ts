/** When a reader may ask again after a 429: in words, and as a flag that clears itself when the time comes. */
import { useEffect, useState } from "react";

export function untilText(at: number, now: number = Date.now()): string {
  const seconds = Math.max(0, Math.ceil((at - now) / 1000));
  if (seconds < 60) return `in ${seconds} s`;
  const minutes = Math.ceil(seconds / 60);
  if (minutes < 60) return `in ${minutes} min`;
  return `at ${new Date(at).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" })}`;
}

/** While asking is refused (until `until`, epoch ms): when it is allowed again, in words, ticking each second. */
export function useRateLimit(until: number | null): { limited: boolean; again: string } {
  const [now, setNow] = useState(() => Date.now());
  useEffect(() => {
    if (!until || until <= now) return;
    const timer = setInterval(() => setNow(Date.now()), 1000);
    return () => clearInterval(timer);
  }, [until, now]);
  const limited = until !== null && until > now;
  return { limited, again: limited ? untilText(until, now) : "" };
}
